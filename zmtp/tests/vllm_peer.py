"""libzmq peers for the interop tests, shaped like vLLM's KV event publisher
(vllm/distributed/kv_events.py, ZmqEventPublisher): a PUB of [topic, seq, payload] with
seq as 8 big-endian bytes, and a ROUTER that answers [b"", start_seq] with one
[b"", seq, payload] per buffered message from start_seq on, then [b"", -1, b""].

    python vllm_peer.py publish             prints "pub ENDPOINT" and "replay ENDPOINT",
                                            then publishes until stdin closes
    python vllm_peer.py connect ENDPOINT    connects a PUB to ENDPOINT (as vLLM 0.33 does
                                            with any endpoint but tcp://*:PORT), prints
                                            "connected", publishes until stdin closes
    python vllm_peer.py subscribe ENDPOINT PREFIX COUNT
                                            prints "TOPIC SEQ PAYLOAD" per message
"""

import collections
import select
import sys

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
TOPIC = b"kv@127.0.0.1:8001@model"


def publish():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.set_hwm(100_000)  # vLLM's default
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    replay = ctx.socket(zmq.ROUTER)
    replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
    print(f"pub tcp://127.0.0.1:{pub_port}", flush=True)
    print(f"replay tcp://127.0.0.1:{replay_port}", flush=True)
    buffer = collections.deque(maxlen=10_000)
    seq = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        if replay.poll(20):
            client, _, start = replay.recv_multipart()
            start = int.from_bytes(start, "big")
            for s, payload in buffer:
                if s >= start:
                    replay.send_multipart((client, b"", s.to_bytes(8, "big"), payload))
            replay.send_multipart((client, b"", END_SEQ, b""))
        payload = b"payload-%d" % seq
        pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), payload))
        # Another topic, which a subscriber to "kv" must not see.
        pub.send_multipart((b"zz", seq.to_bytes(8, "big"), payload))
        buffer.append((seq, payload))
        seq += 1


def connect(endpoint):
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.connect(endpoint)
    print("connected", flush=True)
    seq = 0
    while not select.select([sys.stdin], [], [], 0.005)[0]:
        pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), b"payload-%d" % seq))
        seq += 1


def subscribe(endpoint, prefix, count):
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    sub.setsockopt(zmq.RCVTIMEO, 30_000)
    sub.connect(endpoint)
    print("subscribed", flush=True)
    for _ in range(count):
        topic, seq, payload = sub.recv_multipart()
        print(topic.decode(), int.from_bytes(seq, "big"), payload.decode(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "publish":
        publish()
    elif sys.argv[1] == "connect":
        connect(sys.argv[2])
    else:
        subscribe(sys.argv[2], sys.argv[3], int(sys.argv[4]))
