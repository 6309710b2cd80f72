"""Webhook route configuration: mistakes named by field, routes on and off, 404/405/413.

None of these requests can be published, so no broker is needed: the bridge points at an
address where nothing listens.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.webhook_signing import Request, exchange, settings_for

from connectors.webhook import PUSH_SOURCES, build_routes
from streams.config import ENVIRONMENT, ConfigError, Settings, load_settings


def nowhere() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def load(tmp_path: Path, toml: str) -> Settings:
    path = tmp_path / "config.toml"
    path.write_text(toml)
    return load_settings(path, environ={})


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("[webhook.routes.dropbox]\nsecret_env = 'X'", "routes.dropbox: unknown source"),
        ("[webhook.routes.box]\ntopic_arns = []", "routes.box.topic_arns: not a setting"),
        ("[webhook.routes.minio]\nurl = 'https://x'", "routes.minio.url: not a setting"),
        ("[webhook.routes.supabase]\nsecret_env = 'S'", "routes.supabase.secret_header"),
        ("[webhook.routes.eventbridge]\nsecret_env = 'S'", "routes.eventbridge.secret_header"),
        (
            "[webhook.routes.eventbridge]\nsecret_env = 'S'\nauth = 'basic'",
            "routes.eventbridge.basic_username",
        ),
        ("[webhook.routes.eventbridge]\nauth = 'oauth'", "webhook.routes.eventbridge.auth"),
        ("[webhook.routes.appwrite]\nsecret_env = 'K'", "routes.appwrite.url"),
        ("[webhook.routes.gcs]\naudience = 'https://a'", "routes.gcs.service_account"),
        ("[webhook.routes.s3]\ntopic_arns = ['uploads']", "webhook.routes.s3.topic_arns"),
        (
            "[webhook.routes.s3]\ntopic_arns = ['arn:aws:sns:us-east-1:123456789012:t']\n"
            "[webhook.routes.s3.certificate_files]\n'https://example.com/c.pem' = '/tmp/c.pem'",
            "webhook.routes.s3.certificate_files",
        ),
        ("[webhook.routes.box]\nsecret_env = 'A'\ntoken_env = 'B'", "set one of them"),
        ("[webhook.routes.box]\nsecret_env = 'not a name'", "webhook.routes.box.secret_env"),
        ("[webhook.routes.box]\nsecondary_secret_env = 'S'", "routes.box.secondary_secret_env"),
        ("[webhook.routes.box]\nsecret_env = 'K'\nreplay_window_s = '-5m'", "replay_window_s"),
        ("[webhook.routes.cloudinary]\nsignature_algorithm = 'md5'", "signature_algorithm"),
        ("[webhook.routes.azure]\nallowed_rate = 'fast'", "webhook.routes.azure.allowed_rate"),
        ("[webhook.routes.azure]\nsecret_header = 'bad header'", "routes.azure.secret_header"),
        ("[webhook]\ninsecure_sources = ['s3', 'ftp']", "insecure_sources: unknown source"),
    ],
)
def test_config_mistakes_name_the_field(tmp_path: Path, toml: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load(tmp_path, toml)


def test_valid_route_settings_load(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """
[webhook.routes.box]
secret_env = "BOX_PRIMARY"
secondary_secret_env = "BOX_SECONDARY"
replay_window_s = "5m"
[webhook.routes.minio]
token_env = "MINIO_WEBHOOK_TOKEN"
[webhook.routes.azure]
secret_env = "GRID"
allowed_origins = ["eventgrid.azure.net"]
allowed_rate = "100"
""",
    )
    routes = settings.webhook.routes
    assert routes["box"].replay_window("box") == 300.0
    assert routes["minio"].secret_variable == "MINIO_WEBHOOK_TOKEN"
    assert routes["azure"].query_param("azure") == "code"
    assert routes.get("cloudinary") is None


def test_routes_without_secrets_are_off_and_insecure_is_loud(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = Settings.model_validate(
        {
            "webhook": {
                "insecure_sources": ["minio"],
                "routes": {
                    "box": {"secret_env": "BOX_KEY"},
                    "b2": {"secret_env": "B2_KEY"},
                    "cloudinary": {"secret_env": "CLD", "insecure": True},
                },
            }
        }
    ).webhook
    with caplog.at_level(logging.WARNING):
        routes = build_routes(config, {"B2_KEY": "k", "CLD": "secret"})
    assert sorted(routes) == ["b2", "cloudinary", "minio"]
    assert routes["minio"].insecure and not routes["b2"].insecure
    assert not routes["cloudinary"].insecure  # credentials win over `insecure`
    assert "BOX_KEY" in caplog.text and "is not set" in caplog.text
    assert "/hooks/minio accepts UNAUTHENTICATED deliveries" in caplog.text


def test_unreadable_certificate_file_is_a_config_error(tmp_path: Path) -> None:
    config = Settings.model_validate(
        {
            "webhook": {
                "routes": {
                    "s3": {
                        "topic_arns": ["arn:aws:sns:us-east-1:123456789012:uploads"],
                        "certificate_files": {
                            "https://sns.us-east-1.amazonaws.com/a.pem": str(tmp_path / "no.pem")
                        },
                    }
                }
            }
        }
    ).webhook
    with pytest.raises(ConfigError, match=r"webhook\.routes\.s3\.certificate_files"):
        build_routes(config, {})


def test_off_routes_404_wrong_methods_405_big_bodies_413_before_anything_else() -> None:
    settings = settings_for(
        nowhere(),
        "test.webhook.config",
        {
            "max_body_bytes": 64,
            "routes": {"box": {"secret_env": "BOX_KEY"}, "b2": {"secret_env": "B2_KEY"}},
        },
    )
    environ = {"B2_KEY": "k"}
    requests = [Request(b"{}"), Request(b"{}", method="GET"), Request(b"{}", method="OPTIONS")]
    box, unknown = (
        asyncio.run(exchange(settings, source, requests[:1], environ)) for source in ("box", "ftp")
    )
    assert [answer.status for answer in box] == [404]  # BOX_KEY is not set: route off
    assert [answer.status for answer in unknown] == [404]
    b2 = asyncio.run(
        exchange(settings, "b2", [*requests[1:], Request(b"x" * 65), Request(b"{}")], environ)
    )
    assert [answer.status for answer in b2] == [405, 405, 413, 401]


def test_webhook_help_lists_the_routes_and_the_variables() -> None:
    """Issue 35, item 4: `--help` printed only `usage: ... [-h]`."""
    shown = subprocess.run(
        [sys.executable, "-m", "connectors", "webhook", "--help"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for source in PUSH_SOURCES:
        assert f"POST /hooks/{source} " in shown
    for variable, (section, _) in ENVIRONMENT.items():
        if section == "webhook":
            assert variable in shown
    assert "WEBHOOK_PORT               webhook.port (default 8080)" in shown
    assert "KAFKA_BOOTSTRAP_SERVERS" in shown and "STREAMS_CONFIG" in shown
    assert max(len(line) for line in shown.splitlines()) <= 100
