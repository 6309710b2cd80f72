"""How every Kafka client of the product connects: one settings object, three renderings.

`[kafka]` of the TOML file, each field overridden by its environment variable (`ENVIRONMENT`).
The same fields render

* `aiokafka_args()`: keyword arguments for `AIOKafkaProducer` / `AIOKafkaConsumer` /
  `AIOKafkaAdminClient` (the bridges, `fileevents`, the worker's stages and tools);
* `faust_args()`: the Faust app's `broker` and `broker_credentials`;
* `librdkafka_config()`: confluent-kafka / librdkafka properties (`security.protocol`,
  `sasl.*`, `ssl.*`, `sasl.oauthbearer.*`),

so no client builds its own connection settings and none can be left on PLAINTEXT. It lives in
the fileevents distribution, which a consumer installs without the stream; the stream's
`streams.kafka_settings` re-exports it (`faust_args` imports Faust only when called).

```toml
[kafka]
bootstrap_servers = "b-1.example:9096,b-2.example:9096"
security_protocol = "SASL_SSL"          # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
sasl_mechanism = "SCRAM-SHA-512"        # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER
sasl_username = "storage-events"
sasl_password_file = "/var/run/secrets/kafka/password"   # or env KAFKA_SASL_PASSWORD
ssl_ca_location = "/etc/kafka/ca.pem"   # absent: the system's trust store
```

Secrets (`sasl_password`, `ssl_key_password`, `sasl_oauthbearer_client_secret`) are
`SecretStr`: `repr()`, `str()`, a logged settings object and a validation error show `**********`.
Only the renderings carry them in clear, because the clients need them; never log those.

Errors: a configuration mistake raises ValueError naming the field (streams.config names the
environment variable too). `check_access` opens one connection the way the clients will, and
turns a refused password, an untrusted certificate or a protocol mismatch into a
`KafkaAccessError` whose one line names the setting to fix; `KafkaRefusalWording` makes the
clients' own retry lines say the same (streams.logs bounds them to one per cause every few
seconds).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from aiokafka.abc import AbstractTokenProvider
from pydantic import BaseModel, ConfigDict, PrivateAttr, SecretStr, ValidationError, model_validator

log = logging.getLogger(__name__)

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
OAuthBearerMethod = Literal["oidc", "aws_msk_iam"]

ENVIRONMENT: dict[str, str] = {
    "KAFKA_BOOTSTRAP_SERVERS": "bootstrap_servers",
    "KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "KAFKA_SASL_USERNAME": "sasl_username",
    "KAFKA_SASL_PASSWORD": "sasl_password",
    "KAFKA_SASL_PASSWORD_FILE": "sasl_password_file",
    "KAFKA_SSL_CA_LOCATION": "ssl_ca_location",
    "KAFKA_SSL_CERT_LOCATION": "ssl_cert_location",
    "KAFKA_SSL_KEY_LOCATION": "ssl_key_location",
    "KAFKA_SSL_KEY_PASSWORD": "ssl_key_password",
    "KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "ssl_endpoint_identification_algorithm",
    "KAFKA_SASL_OAUTHBEARER_METHOD": "sasl_oauthbearer_method",
    "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "sasl_oauthbearer_token_endpoint_url",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "sasl_oauthbearer_client_id",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "sasl_oauthbearer_client_secret",
    "KAFKA_SASL_OAUTHBEARER_SCOPE": "sasl_oauthbearer_scope",
    "KAFKA_SASL_OAUTHBEARER_AWS_REGION": "sasl_oauthbearer_aws_region",
    "KAFKA_SASL_OAUTHBEARER_AWS_ROLE_ARN": "sasl_oauthbearer_aws_role_arn",
    "KAFKA_SASL_OAUTHBEARER_AWS_PROFILE": "sasl_oauthbearer_aws_profile",
}
"""Environment variable -> `[kafka]` field; the variable wins over the file."""
VARIABLE = {field: variable for variable, field in ENVIRONMENT.items()}
"""`[kafka]` field -> its environment variable (for messages)."""

TOKEN_REFRESH_MARGIN_S = 60.0
"""A cached OAUTHBEARER token is replaced this long before it expires."""


def setting(field: str) -> str:
    """How a message names a setting: its environment variable and its TOML field."""
    return f"{VARIABLE[field]} (kafka.{field})"


class KafkaAccessError(Exception):
    """Kafka refused this client's credentials or TLS: one line naming the setting to fix."""


class KafkaSettings(BaseModel):
    """The connection of every Kafka client: address, TLS, SASL. Built once per process
    (`streams.config.load_settings`, or `from_environ` for `fileevents`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    """Required with SASL_PLAINTEXT / SASL_SSL."""
    sasl_username: str | None = None
    """PLAIN and SCRAM (Confluent Cloud: the API key)."""
    sasl_password: SecretStr | None = None
    """PLAIN and SCRAM; or `sasl_password_file` (a mounted Secret), not both."""
    sasl_password_file: Path | None = None
    """A file holding the password (one trailing newline is ignored), read at start-up."""
    ssl_ca_location: Path | None = None
    """PEM file of the CA(s) the broker's certificate must chain to; absent: the system's
    trust store (Confluent Cloud, MSK)."""
    ssl_cert_location: Path | None = None
    """Mutual TLS: this client's certificate (PEM), with `ssl_key_location`."""
    ssl_key_location: Path | None = None
    """Mutual TLS: this client's private key (PEM)."""
    ssl_key_password: SecretStr | None = None
    """The private key's password, when it is encrypted."""
    ssl_endpoint_identification_algorithm: Literal["https", "none"] = "https"
    """`https` (the default): the broker's certificate must name the host connected to;
    `none` turns that check off (the chain is still verified), as librdkafka's property."""
    sasl_oauthbearer_method: OAuthBearerMethod = "oidc"
    """OAUTHBEARER's token provider: `oidc` (OAuth 2 client credentials at
    `sasl_oauthbearer_token_endpoint_url`), or `aws_msk_iam` (Amazon MSK IAM, signed with the
    AWS credentials of the process; needs the `msk-iam` extra)."""
    sasl_oauthbearer_token_endpoint_url: str | None = None
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: SecretStr | None = None
    sasl_oauthbearer_scope: str | None = None
    sasl_oauthbearer_aws_region: str | None = None
    """aws_msk_iam: the cluster's region (required)."""
    sasl_oauthbearer_aws_role_arn: str | None = None
    """aws_msk_iam: sign as this role (assumed through STS) instead of the process' own."""
    sasl_oauthbearer_aws_profile: str | None = None
    """aws_msk_iam: sign with this profile of the AWS config files."""

    SECRETS: ClassVar[tuple[str, ...]] = (
        "sasl_password",
        "ssl_key_password",
        "sasl_oauthbearer_client_secret",
    )

    _token_provider: AbstractTokenProvider | None = PrivateAttr(default=None)
    _file_password: SecretStr | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        protocol = self.security_protocol
        sasl = protocol.startswith("SASL_")
        if not self.bootstrap_servers.strip() or any(
            not host.strip() for host in self.bootstrap_servers.split(",")
        ):
            raise ValueError("bootstrap_servers: needs host:port[,host:port]")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"sasl_mechanism: required with security_protocol {protocol}")
        if not sasl:
            named = [field for field in self._sasl_fields() if getattr(self, field) is not None]
            if named:
                raise ValueError(
                    f"{named[0]}: set, but security_protocol {protocol} uses no SASL "
                    "(SASL_PLAINTEXT or SASL_SSL)"
                )
        if not self.uses_tls:
            named = [field for field in self._ssl_fields() if getattr(self, field) is not None]
            if named:
                raise ValueError(
                    f"{named[0]}: set, but security_protocol {protocol} uses no TLS "
                    "(SSL or SASL_SSL)"
                )
        if (self.ssl_cert_location is None) != (self.ssl_key_location is None):
            missing = "ssl_key_location" if self.ssl_key_location is None else "ssl_cert_location"
            raise ValueError(
                f"{missing}: mutual TLS needs both ssl_cert_location and ssl_key_location"
            )
        if self.sasl_password is not None and self.sasl_password_file is not None:
            raise ValueError(
                "sasl_password_file: set sasl_password or sasl_password_file, not both"
            )
        mechanism = self.sasl_mechanism
        if mechanism is not None and mechanism != "OAUTHBEARER":
            if not self.sasl_username:
                raise ValueError(f"sasl_username: required with sasl_mechanism {mechanism}")
            if self.sasl_password is None and self.sasl_password_file is None:
                raise ValueError(
                    f"sasl_password: required with sasl_mechanism {mechanism} "
                    "(or sasl_password_file)"
                )
        if mechanism == "OAUTHBEARER":
            self._check_oauthbearer()
        for field in ("ssl_ca_location", "ssl_cert_location", "ssl_key_location"):
            path = getattr(self, field)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{field}: no such file {str(path)!r}")
        if self.sasl_password_file is not None:
            try:
                text = Path(self.sasl_password_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                raise ValueError(
                    f"sasl_password_file: cannot read {str(self.sasl_password_file)!r}: {reason}"
                ) from None
            password = text.removesuffix("\n").removesuffix("\r")
            if not password:
                raise ValueError(f"sasl_password_file: {str(self.sasl_password_file)!r} is empty")
            self._file_password = SecretStr(password)
        if self.uses_tls:
            self.ssl_context()  # a PEM file that does not load stops start-up, naming the field
        return self

    def _check_oauthbearer(self) -> None:
        if self.sasl_oauthbearer_method == "oidc":
            for field in (
                "sasl_oauthbearer_token_endpoint_url",
                "sasl_oauthbearer_client_id",
                "sasl_oauthbearer_client_secret",
            ):
                if not getattr(self, field):
                    raise ValueError(f"{field}: required with sasl_oauthbearer_method oidc")
            url = self.sasl_oauthbearer_token_endpoint_url or ""
            if not url.startswith(("https://", "http://")):
                raise ValueError(
                    f"sasl_oauthbearer_token_endpoint_url: {url!r} is not an http(s) URL"
                )
        else:
            if not self.sasl_oauthbearer_aws_region:
                raise ValueError(
                    "sasl_oauthbearer_aws_region: required with sasl_oauthbearer_method aws_msk_iam"
                )
            if self.sasl_oauthbearer_aws_role_arn and self.sasl_oauthbearer_aws_profile:
                raise ValueError(
                    "sasl_oauthbearer_aws_profile: set sasl_oauthbearer_aws_role_arn or "
                    "sasl_oauthbearer_aws_profile, not both"
                )
            try:
                import aws_msk_iam_sasl_signer  # noqa: F401
            except ImportError:
                raise ValueError(
                    "sasl_oauthbearer_method: aws_msk_iam needs the package "
                    "aws-msk-iam-sasl-signer-python (pip install 'storage-events[msk-iam]')"
                ) from None

    @staticmethod
    def _sasl_fields() -> tuple[str, ...]:
        return (
            "sasl_mechanism",
            "sasl_username",
            "sasl_password",
            "sasl_password_file",
            "sasl_oauthbearer_token_endpoint_url",
            "sasl_oauthbearer_client_id",
            "sasl_oauthbearer_client_secret",
            "sasl_oauthbearer_scope",
            "sasl_oauthbearer_aws_region",
            "sasl_oauthbearer_aws_role_arn",
            "sasl_oauthbearer_aws_profile",
        )

    @staticmethod
    def _ssl_fields() -> tuple[str, ...]:
        return ("ssl_ca_location", "ssl_cert_location", "ssl_key_location", "ssl_key_password")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **fields: Any) -> KafkaSettings:
        """The settings from `KAFKA_*` environment variables alone (no config file), `fields`
        given by the caller winning; for `fileevents` and tools. Raises ValueError naming
        the variable."""
        import os

        environ = os.environ if environ is None else environ
        data: dict[str, Any] = {
            field: environ[variable]
            for variable, field in ENVIRONMENT.items()
            if environ.get(variable)
        }
        data.update({name: value for name, value in fields.items() if value is not None})
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = []
            for item in exc.errors():
                message = item["msg"].removeprefix("Value error, ")
                field = str(item["loc"][0]) if item["loc"] else message.partition(":")[0]
                variable = VARIABLE.get(field)
                if variable is not None and field not in fields and variable in environ:
                    message += f" (from environment variable {variable})"
                problems.append(f"kafka.{field}: {message}" if item["loc"] else message)
            raise ValueError("; ".join(problems)) from None

    @classmethod
    def of(cls, kafka: KafkaSettings | str) -> KafkaSettings:
        """`kafka` itself, or a bare `host:port[,...]` as PLAINTEXT settings (tests and
        tools that name a local broker)."""
        return kafka if isinstance(kafka, KafkaSettings) else cls(bootstrap_servers=kafka)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def hosts(self) -> list[str]:
        return [host.strip() for host in self.bootstrap_servers.split(",")]

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context every aiokafka client and Faust use, from the same files as
        librdkafka's `ssl.*` properties; None without TLS."""
        if not self.uses_tls:
            return None
        ca = self.ssl_ca_location
        try:
            context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"ssl_ca_location: {str(ca)!r} holds no usable PEM CA: {exc}"
            ) from None
        context.check_hostname = self.ssl_endpoint_identification_algorithm == "https"
        if self.ssl_cert_location is not None:
            # "" rather than None: OpenSSL would prompt on the terminal for an encrypted key.
            password = self.ssl_key_password.get_secret_value() if self.ssl_key_password else ""
            try:
                context.load_cert_chain(
                    str(self.ssl_cert_location), str(self.ssl_key_location), password=password
                )
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    "ssl_cert_location: the client certificate and ssl_key_location do not load "
                    f"(not PEM, not a pair, or ssl_key_password is wrong): {exc}"
                ) from None
        return context

    def token_provider(self) -> AbstractTokenProvider | None:
        """OAUTHBEARER's token provider, one per settings object so that every client of a
        process shares its cached token."""
        if self.sasl_mechanism != "OAUTHBEARER":
            return None
        if self._token_provider is None:
            self._token_provider = (
                OidcTokenProvider(self)
                if self.sasl_oauthbearer_method == "oidc"
                else MskIamTokenProvider(self)
            )
        return self._token_provider

    def aiokafka_args(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client: `AIOKafkaProducer(**kafka.aiokafka_args(),
        acks="all")`. Carries the password in clear: never log it."""
        args: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.uses_tls:
            args["ssl_context"] = self.ssl_context()
        if self.sasl_mechanism is not None:
            args["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_mechanism == "OAUTHBEARER":
            args["sasl_oauth_token_provider"] = self.token_provider()
        elif self.sasl_mechanism is not None:
            args["sasl_plain_username"] = self.sasl_username
            args["sasl_plain_password"] = self._password()
        return args

    def connection_args(self) -> dict[str, Any]:
        """`aiokafka_args` without the address: for `aiokafka.conn.create_conn`."""
        args = self.aiokafka_args()
        del args["bootstrap_servers"]
        return args

    def faust_args(self) -> dict[str, Any]:
        """`faust.App(id, **kafka.faust_args(), ...)`: the broker URLs and `broker_credentials`
        (faust.SASLCredentials / OAuthCredentials / SSLCredentials with the same TLS context)."""
        import faust

        credentials: Any = None
        context = self.ssl_context()
        if self.sasl_mechanism == "OAUTHBEARER":
            provider = self.token_provider()
            assert provider is not None
            credentials = faust.OAuthCredentials(oauth_cb=provider, ssl_context=context)
        elif self.sasl_mechanism is not None:
            credentials = faust.SASLCredentials(
                username=self.sasl_username,
                password=self._password(),
                ssl_context=context,
                mechanism=self.sasl_mechanism,
            )
        elif context is not None:
            credentials = faust.SSLCredentials(context)
        return {
            "broker": [f"kafka://{host}" for host in self.hosts],
            "broker_credentials": credentials,
        }

    def librdkafka_config(self) -> dict[str, Any]:
        """librdkafka (confluent-kafka) properties from the same fields. OIDC is librdkafka's
        own `sasl.oauthbearer.method=oidc`; MSK IAM is an `oauth_cb` (confluent-kafka's
        Python token callback). Carries secrets in clear: never log it."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.uses_tls:
            config["ssl.endpoint.identification.algorithm"] = (
                self.ssl_endpoint_identification_algorithm
            )
            for field, name in (
                ("ssl_ca_location", "ssl.ca.location"),
                ("ssl_cert_location", "ssl.certificate.location"),
                ("ssl_key_location", "ssl.key.location"),
            ):
                if getattr(self, field) is not None:
                    config[name] = str(getattr(self, field))
            if self.ssl_key_password is not None:
                config["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        if self.sasl_mechanism is not None:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_mechanism == "OAUTHBEARER":
            if self.sasl_oauthbearer_method == "oidc":
                secret = self.sasl_oauthbearer_client_secret
                config["sasl.oauthbearer.method"] = "oidc"
                config["sasl.oauthbearer.token.endpoint.url"] = (
                    self.sasl_oauthbearer_token_endpoint_url
                )
                config["sasl.oauthbearer.client.id"] = self.sasl_oauthbearer_client_id
                config["sasl.oauthbearer.client.secret"] = (
                    secret.get_secret_value() if secret else None
                )
                if self.sasl_oauthbearer_scope:
                    config["sasl.oauthbearer.scope"] = self.sasl_oauthbearer_scope
            else:
                provider = MskIamTokenProvider(self)
                config["oauth_cb"] = provider.librdkafka_callback
        elif self.sasl_mechanism is not None:
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self._password()
        return config

    def _password(self) -> str | None:
        password = self.sasl_password or self._file_password
        return password.get_secret_value() if password else None

    def describe(self) -> str:
        """One line for a start-up log: how this process connects, no secrets."""
        parts = [self.bootstrap_servers, self.security_protocol]
        if self.sasl_mechanism:
            who = (
                f" as {self.sasl_username}"
                if self.sasl_username and self.sasl_mechanism != "OAUTHBEARER"
                else ""
            )
            parts.append(f"{self.sasl_mechanism}{who}")
        if self.uses_tls:
            parts.append(f"CA {self.ssl_ca_location or 'system trust store'}")
            if self.ssl_cert_location:
                parts.append(f"client certificate {self.ssl_cert_location}")
            if self.ssl_endpoint_identification_algorithm == "none":
                parts.append("hostname NOT verified")
        return ", ".join(parts)


class OidcTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """OAUTHBEARER tokens by the OAuth 2 client-credentials grant (RFC 6749 4.4), client id
    and secret in HTTP Basic auth as librdkafka's `oidc` method sends them; cached until
    `TOKEN_REFRESH_MARGIN_S` before `expires_in`."""

    def __init__(self, kafka: KafkaSettings, clock: Callable[[], float] = time.time) -> None:
        self._kafka = kafka
        self._clock = clock
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        async with self._lock:
            token = self._token
            if token is None or self._clock() >= self._expires_at - TOKEN_REFRESH_MARGIN_S:
                token, lifetime = await self._fetch()
                self._token, self._expires_at = token, self._clock() + lifetime
            return token

    async def _fetch(self) -> tuple[str, float]:
        import aiohttp

        kafka = self._kafka
        url = kafka.sasl_oauthbearer_token_endpoint_url or ""
        secret = kafka.sasl_oauthbearer_client_secret
        form = {"grant_type": "client_credentials"}
        if kafka.sasl_oauthbearer_scope:
            form["scope"] = kafka.sasl_oauthbearer_scope
        client_secret = secret.get_secret_value() if secret else ""
        pair = f"{kafka.sasl_oauthbearer_client_id or ''}:{client_secret}"
        headers = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
        where = setting("sasl_oauthbearer_token_endpoint_url")
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session,
                session.post(url, data=form, headers=headers) as response,
            ):
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KafkaAccessError(
                f"{where}: the token endpoint cannot be reached: {exc!r}"
            ) from None
        if status in (400, 401, 403):
            raise KafkaAccessError(
                f"{setting('sasl_oauthbearer_client_id')} / "
                f"{setting('sasl_oauthbearer_client_secret')}: the token endpoint refused the "
                f"client credentials (HTTP {status})"
            )
        try:
            answer = json.loads(body)
            token = answer["access_token"]
            lifetime = float(answer.get("expires_in", 300))
        except (ValueError, KeyError, TypeError):
            raise KafkaAccessError(
                f"{where}: HTTP {status} without an access_token in JSON"
            ) from None
        if status != 200 or not isinstance(token, str) or not token:
            raise KafkaAccessError(f"{where}: HTTP {status} without an access_token")
        return token, lifetime


class MskIamTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """Amazon MSK IAM tokens (SigV4-signed, by aws-msk-iam-sasl-signer-python), with the
    process' AWS credentials, a role or a profile; cached until shortly before they expire."""

    def __init__(self, kafka: KafkaSettings, clock: Callable[[], float] = time.time) -> None:
        self._kafka = kafka
        self._clock = clock
        self._token: str | None = None
        self._expires_at = 0.0

    def generate(self) -> tuple[str, float]:
        """A fresh token and its expiry (seconds since the epoch); may read credentials."""
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        kafka = self._kafka
        region = kafka.sasl_oauthbearer_aws_region
        try:
            if kafka.sasl_oauthbearer_aws_role_arn:
                token, expiry_ms = MSKAuthTokenProvider.generate_auth_token_from_role_arn(
                    region, kafka.sasl_oauthbearer_aws_role_arn
                )
            elif kafka.sasl_oauthbearer_aws_profile:
                token, expiry_ms = MSKAuthTokenProvider.generate_auth_token_from_profile(
                    region, kafka.sasl_oauthbearer_aws_profile
                )
            else:
                token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
        except Exception as exc:  # botocore raises many kinds for missing credentials
            raise KafkaAccessError(
                f"{setting('sasl_oauthbearer_method')} aws_msk_iam: no AWS credentials to sign "
                f"with ({type(exc).__name__}: {exc})"
            ) from None
        return token, expiry_ms / 1000.0

    async def token(self) -> str:
        if self._token is None or self._clock() >= self._expires_at - TOKEN_REFRESH_MARGIN_S:
            fresh, self._expires_at = await asyncio.to_thread(self.generate)
            self._token = fresh
            return fresh
        return self._token

    def librdkafka_callback(self, _config: str) -> tuple[str, float]:
        """confluent-kafka's `oauth_cb`: (token, expiry in seconds since the epoch)."""
        return self.generate()


def explain(exc: BaseException, kafka: KafkaSettings, where: str = "") -> tuple[str, bool] | None:
    """What a connection failure means for the settings: (one line naming the setting,
    certain), or None when it says nothing about them (the broker is unreachable).
    `certain` is False for a guess (a connection closed at once: maybe a protocol mismatch,
    maybe a broker going down)."""
    from aiokafka import errors

    at = f" at {where}" if where else ""
    if isinstance(exc, KafkaAccessError):
        return str(exc), True
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or str(exc)
        if "mismatch" in reason.lower():
            return (
                f"{setting('ssl_endpoint_identification_algorithm')}: the broker's certificate"
                f"{at} does not name that host ({reason}); connect by a name the certificate "
                "has, or set it to none to skip the check",
                True,
            )
        return (
            f"{setting('ssl_ca_location')}: the broker's certificate{at} is not trusted "
            f"({reason}); name the CA that signed it",
            True,
        )
    if isinstance(exc, ssl.SSLError):
        return (
            f"{setting('security_protocol')}: the TLS handshake{at} failed ({exc.reason or exc}): "
            f"is that listener TLS ({kafka.security_protocol})? (or it refused the client "
            f"certificate {setting('ssl_cert_location')})",
            True,
        )
    if isinstance(exc, errors.UnsupportedSaslMechanismError):
        return f"{setting('sasl_mechanism')}: {exc}", True
    if isinstance(exc, errors.SaslAuthenticationFailed | errors.AuthenticationFailedError):
        if kafka.sasl_mechanism == "OAUTHBEARER":
            return f"{setting('sasl_oauthbearer_method')}: Kafka refused the token{at}: {exc}", True
        return (
            f"{setting('sasl_password')}: Kafka refused the password of "
            f"{setting('sasl_username')}={kafka.sasl_username!r}{at} ({exc})",
            True,
        )
    if isinstance(exc, errors.IllegalSaslStateError):
        return (
            f"{setting('security_protocol')}: the listener{at} does not take SASL as "
            f"{kafka.security_protocol} sends it ({exc})",
            True,
        )
    if isinstance(exc, errors.KafkaConnectionError) and "closed" in str(exc):
        return (
            f"{setting('security_protocol')}: the broker{at} closed the connection at once: "
            f"does that listener take {kafka.security_protocol}? (a TLS or SASL listener drops "
            "a client that does not speak it)",
            False,
        )
    return None


async def check_access(kafka: KafkaSettings, timeout_s: float = 10.0) -> tuple[str, bool] | None:
    """Connect to the bootstrap servers as the clients will (TLS, SASL, one metadata
    request); return `explain`'s (line, certain) for the first host that refused these
    settings, or None when one accepted them or none could be reached (the callers' own
    retries handle an absent broker)."""
    from aiokafka.conn import collect_hosts, create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    problem: tuple[str, bool] | None = None
    for host, port, _family in collect_hosts(kafka.bootstrap_servers, randomize=False):
        where = f"{host}:{port}"
        try:
            conn = await create_conn(
                host, port, request_timeout_ms=int(timeout_s * 1000), **kafka.connection_args()
            )
        except Exception as exc:  # any failure is explained or skipped
            problem = problem or await _explain_closed(
                explain(exc, kafka, where), kafka, host, port
            )
            continue
        try:
            await conn.send(MetadataRequest[0]([]))
        except Exception as exc:
            problem = problem or await _explain_closed(
                explain(exc, kafka, where), kafka, host, port
            )
            continue
        finally:
            conn.close()
        return None
    return problem


async def _explain_closed(
    problem: tuple[str, bool] | None, kafka: KafkaSettings, host: str, port: int
) -> tuple[str, bool] | None:
    """`problem`, made certain when it is the guess of a closed connection and a client
    without TLS meets a listener that completes a TLS handshake (a SASL_SSL or SSL one)."""
    if problem is None or problem[1] or kafka.security_protocol not in PLAIN_PROTOCOLS:
        return problem
    if not await speaks_tls(host, port):
        return problem
    return (
        f"{setting('security_protocol')} is {kafka.security_protocol}, but the listener at "
        f"{host}:{port} speaks TLS: set it to SASL_SSL (with {setting('sasl_mechanism')} and "
        f"its credentials) or SSL (with {setting('ssl_cert_location')} for mutual TLS); a "
        "local broker's client.env has its settings (`make kafka` names it)",
        True,
    )


PLAIN_PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT")
"""The security protocols that speak no TLS."""


async def speaks_tls(host: str, port: int, timeout_s: float = 5.0) -> bool:
    """True when `host:port` completes a TLS handshake (its certificate is not checked: this
    only tells which protocol the listener speaks)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context), timeout_s
        )
    except (OSError, ssl.SSLError, TimeoutError, asyncio.TimeoutError):  # 3.10: not one class
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


async def require_access(kafka: KafkaSettings, timeout_s: float = 10.0) -> None:
    """`check_access` for commands: raise KafkaAccessError on any refusal."""
    problem = await check_access(kafka, timeout_s)
    if problem is not None:
        raise KafkaAccessError(problem[0])


class KafkaRefusalWording(logging.Filter):
    """On the Kafka client loggers: a connection-failure line whose cause is a refused
    credential or certificate says so and names the setting ("Kafka refuses this client,
    retrying: Unable connect to node with id 1: KAFKA_SASL_PASSWORD (kafka.sasl_password):
    Kafka refused the password of ..."). Repeats are bounded by streams.logs.RepeatFilter,
    installed before this one (a logger's filters run in order)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        super().__init__()
        self._kafka = kafka

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        cause = next((arg for arg in args if isinstance(arg, BaseException)), None)
        explained = explain(cause, self._kafka) if cause is not None else None
        if explained is not None and explained[1]:
            # The cause's text becomes the explanation; the rest of the line (which node,
            # and RepeatFilter's "(and N more like it in 5 s)") stays.
            record.msg = f"Kafka refuses this client, retrying: {record.msg}"
            record.args = tuple(explained[0] if arg is cause else arg for arg in args)
        return True

    def install(self, prefixes: tuple[str, ...] = ("aiokafka", "faust.transport")) -> None:
        """Put this filter on every logger under `prefixes` that exists now, once."""
        import aiokafka  # noqa: F401  (creates the aiokafka.* module loggers)

        names = [
            name
            for name in list(logging.Logger.manager.loggerDict)
            if any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)
        ]
        for name in sorted({*names, *prefixes}):
            logger = logging.getLogger(name)
            if not any(isinstance(item, KafkaRefusalWording) for item in logger.filters):
                logger.addFilter(self)
