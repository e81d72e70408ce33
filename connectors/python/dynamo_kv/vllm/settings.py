"""What the connector reads from vLLM's `--kv-transfer-config`
(`kv_connector_extra_config`), with its defaults. docs/vllm-connector.md lists them."""

from dataclasses import dataclass

from ..blocks import Credential


@dataclass(frozen=True)
class Settings:
    # The sidecar's block API, `host:port` (its gRPC port, 9100 in our pods).
    block_api: str = "127.0.0.1:9100"
    # What salts block hashes: the name the router and the sidecar hash prompts with
    # (the sidecar's `--model-name`); vLLM's served model name when unset.
    model_name: str | None = None
    # The graph's credential; unset: the file `DYNAMO_BLOCK_API_TOKEN_FILE` names, if any.
    token_file: str | None = None
    # Longest the scheduler waits for a lookup before it computes the prompt instead; it
    # schedules other requests meanwhile.
    lookup_timeout_s: float = 0.5
    # Longest one onboarding or offloading call may take.
    transfer_timeout_s: float = 10.0
    # Shared memory asked of the sidecar, per direction (payloads past it go inline).
    region_bytes: int = 256 << 20
    # Copied-out payloads waiting to be offloaded; past it new saves are dropped (a slow
    # sidecar never holds the engine's blocks).
    offload_queue_bytes: int = 1 << 30
    # Blocks the scheduler remembers the tiers hold, so it does not copy them out again.
    known_blocks: int = 16384

    @classmethod
    def of(cls, vllm_config) -> "Settings":
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        known = cls.__dataclass_fields__
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(
                f"DynamoSidecarConnector: unknown kv_connector_extra_config keys {unknown}; "
                f"it takes {sorted(known)}"
            )
        values = {name: _typed(name, value, known[name].default) for name, value in extra.items()}
        if values.get("model_name") is None:
            served = vllm_config.model_config.served_model_name
            name = served[0] if isinstance(served, (list, tuple)) else served
            values["model_name"] = name or vllm_config.model_config.model
        return cls(**values)

    def credential(self) -> Credential | None:
        return Credential.from_env(self.token_file)


def _typed(name: str, value, default):
    """`value` as the type of the field's default (JSON numbers may be ints or floats)."""
    if default is None or isinstance(default, str):
        ok = value is None or isinstance(value, str)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        value = float(value) if ok else value
    if not ok:
        raise ValueError(f"DynamoSidecarConnector: {name} = {value!r} is not a valid value")
    return value
