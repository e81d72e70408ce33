"""vLLM's KV connector for the sidecar's KV block tiers: `DynamoSidecarConnector`
(`kv_connector_module_path: dynamo_kv.vllm`)."""

from .connector import DynamoSidecarConnector

__all__ = ["DynamoSidecarConnector"]
