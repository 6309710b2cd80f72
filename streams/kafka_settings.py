"""How every Kafka client of the product connects: fileevents' connection settings
(`fileevents.kafka_settings`), re-exported, so that the stream and its consumers read one
`[kafka]` configuration with one class (fileevents is its own distribution and imports
nothing of `streams`).

`KafkaSettings` renders the same fields for every client: `librdkafka_config()` for the
engine (stages, restore, topics, offsets, status) and the commands that read topics (tail,
dead-letters, replay-dead-letters: streams/reader.py), all confluent-kafka; `aiokafka_args()`
for Faust, the bridges, `fileevents` and the requests librdkafka cannot make, and
`faust_args()` for the Faust app. `check_access` turns a refused password, an untrusted
certificate or a protocol mismatch into one `KafkaAccessError` line naming the setting. A
change to connection settings goes into fileevents/src/fileevents/kafka_settings.py.
"""

from __future__ import annotations

from fileevents.kafka_settings import ENVIRONMENT as ENVIRONMENT
from fileevents.kafka_settings import PLAIN_PROTOCOLS as PLAIN_PROTOCOLS
from fileevents.kafka_settings import TOKEN_REFRESH_MARGIN_S as TOKEN_REFRESH_MARGIN_S
from fileevents.kafka_settings import VARIABLE as VARIABLE
from fileevents.kafka_settings import KafkaAccessError as KafkaAccessError
from fileevents.kafka_settings import KafkaRefusalWording as KafkaRefusalWording
from fileevents.kafka_settings import KafkaSettings as KafkaSettings
from fileevents.kafka_settings import MskIamTokenProvider as MskIamTokenProvider
from fileevents.kafka_settings import OidcTokenProvider as OidcTokenProvider
from fileevents.kafka_settings import check_access as check_access
from fileevents.kafka_settings import explain as explain
from fileevents.kafka_settings import require_access as require_access
from fileevents.kafka_settings import setting as setting
from fileevents.kafka_settings import speaks_tls as speaks_tls
