"""A real sidecar process for the connector's tests (the binary `DYNAMO_SIDECAR_BIN`
names), on free loopback ports it reports when it serves."""

import os
import re
import signal
import subprocess
import tempfile
import threading
import time

_SERVING = re.compile(r"dynamo-sidecar serving.*grpc=(\S+).*metrics=(\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MODEL = "test-model"


class Sidecar:
    def __init__(self, *flags: str, token: str | None = "test-graph-token", block_size: int = 16, kv_events: str | None = None):
        """With `kv_events`, it listens there for the engine's KV event publisher to
        connect, as our pods wire vLLM 0.33."""
        self.dir = tempfile.TemporaryDirectory(prefix="dynamo-sidecar-")
        self.token_file = None
        args = [
            os.environ["DYNAMO_SIDECAR_BIN"],
            "--listen", "127.0.0.1:0",
            "--host", "127.0.0.1",
            "--grpc-port", "0",
            "--metrics-port", "0",
            # No engine: the block API and the KV event relay are what is tested.
            "--engine-url", "http://127.0.0.1:9",
            "--engine-kv-events", kv_events or "none",
            "--model-name", MODEL,
            "--block-size", str(block_size),
            "--kv-region-dir", self.dir.name,
        ]
        if kv_events:
            args.append("--engine-kv-events-listen")
        if token is not None:
            self.token_file = os.path.join(self.dir.name, "token")
            with open(self.token_file, "w") as f:
                f.write(token + "\n")
            args += ["--block-api-token-file", self.token_file]
        args += list(flags)
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "NO_COLOR": "1", "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
        self.log: list[str] = []
        self._serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._serving.wait(60):
            self.stop()
            raise RuntimeError("the sidecar did not start:\n" + "".join(self.log))

    def _read(self):
        for line in self.process.stdout:
            line = _ANSI.sub("", line)
            self.log.append(line)
            found = _SERVING.search(line)
            if found:
                self.grpc, self.metrics = found.group(1), found.group(2)
                self._serving.set()

    @property
    def block_api(self) -> str:
        return self.grpc

    def metric(self, name: str, labels: str = "") -> float:
        import urllib.request

        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            if re.split(r"[ {]", line, maxsplit=1)[0] == name and labels in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def freeze(self):
        """Stops the process (SIGSTOP), and returns once every thread of it has stopped:
        on a loaded machine a thread may still run for a moment after the signal."""
        self.process.send_signal(signal.SIGSTOP)
        tasks = f"/proc/{self.process.pid}/task"

        def state(task):
            with open(f"{tasks}/{task}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]

        eventually(lambda: all(state(t) in "Tt" for t in os.listdir(tasks)), "the sidecar stopped")

    def thaw(self):
        self.process.send_signal(signal.SIGCONT)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self.dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def eventually(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.02)
