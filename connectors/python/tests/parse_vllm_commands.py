"""Parses vLLM command lines (`vllm serve ...`) as vLLM 0.33's own CLI does: `vllm
serve`'s parser, its validation, `AsyncEngineArgs.from_cli_args`, and each KV connector
its `--kv-transfer-config` names resolved to its class as vLLM's connector factory does.

    python parse_vllm_commands.py FILE    FILE: [{"context": ..., "argv": [...]}, ...]

Prints, per command line, {"context", "connectors": [class names], "kv_events":
endpoint or null}; exits non-zero at the first that does not parse."""

import json
import sys

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser


def connectors(config: KVTransferConfig | None) -> list[str]:
    if config is None:
        return []
    if config.kv_connector == "MultiConnector":
        children = config.kv_connector_extra_config.get("connectors", [])
        return [name for child in children for name in connectors(KVTransferConfig(**child))]
    return [KVConnectorFactory.get_connector_class(config).__name__]


def parse(argv: list[str]) -> dict:
    if argv[:2] != ["vllm", "serve"]:
        raise ValueError("not `vllm serve`")
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    (command,) = serve.cmd_init()
    command.subparser_init(subparsers)
    args = parser.parse_args(argv[1:])
    command.validate(args)
    if args.model_tag is not None:
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    events = engine.kv_events_config
    return {
        "connectors": connectors(engine.kv_transfer_config),
        "kv_events": events.endpoint if events is not None and events.enable_kv_cache_events else None,
    }


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        try:
            parsed = parse(case["argv"])
        except BaseException as e:  # argparse exits; say which command line
            print(f"{case['context']}: {case['argv']} does not parse: {e!r}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps({"context": case["context"], **parsed}), flush=True)


if __name__ == "__main__":
    main()
