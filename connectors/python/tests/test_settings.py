"""The connector's settings: a misspelt key or a value of the wrong type stops the engine
at start, naming it; the model that salts hashes defaults to vLLM's served name."""

from types import SimpleNamespace

import pytest

from dynamo_kv.vllm.settings import Settings


def config(extra, served="served-name"):
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra),
        model_config=SimpleNamespace(served_model_name=[served], model="/models/m"),
    )


def test_defaults_and_the_served_name():
    settings = Settings.of(config({}))
    assert settings.block_api == "127.0.0.1:9100"
    assert settings.model_name == "served-name"
    assert settings.lookup_timeout_s == 0.5
    given = Settings.of(config({"block_api": "10.0.0.1:9100", "model_name": "m", "lookup_timeout_s": 1}))
    assert (given.block_api, given.model_name, given.lookup_timeout_s) == ("10.0.0.1:9100", "m", 1.0)


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"block-api": "x"}, "block-api"),
        ({"lookup_timeout_s": "fast"}, "lookup_timeout_s"),
        ({"region_bytes": 1.5}, "region_bytes"),
        ({"known_blocks": 0}, "known_blocks"),
        ({"token_file": 7}, "token_file"),
    ],
)
def test_a_bad_key_or_value_is_refused_by_name(extra, named):
    with pytest.raises(ValueError, match=named):
        Settings.of(config(extra))
