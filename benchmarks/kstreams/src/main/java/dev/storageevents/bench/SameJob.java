package dev.storageevents.bench;

import com.fasterxml.jackson.core.StreamReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.ObjectReader;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.math.BigInteger;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.DateTimeException;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The pipeline's job (streams/) on Kafka Streams, for `make bench`, written to produce what the
 * pipeline produces (issue 32 item 1, a like-for-like peer):
 *
 * <ol>
 *   <li>stage one parses each raw record by its `source` header (streams/core/normalizers s3,
 *       gcs, azure: the shapes benchmarks/pipeline.py generates) into the canonical event, `raw`
 *       included, with the pipeline's ids and fields (streams/core/event.py); holds it to the
 *       normalizers' bounds (key, bucket, id and token lengths, events per delivery), applies
 *       the instance's rules (bucket, prefix and its escapes, sources) and the size bound
 *       (streams/core/records.py `event_record_bytes` over EVENT_MAX_MESSAGE_BYTES), and writes
 *       the event's JSON to the repartition topic keyed `instance/bucket/key` with an
 *       `instance` header (`keyed_record`); a delivery it cannot read, or one of whose events is
 *       too large, becomes one dead letter (`dead_letter_record`: the original key, value and
 *       headers plus `error`, `error.stage`, `error.topic`) and nothing else;
 *   <li>stage two reads the event from the repartition topic, dedupes and orders it on one
 *       record per (instance, scope, bucket, key) in a RocksDB store with a changelog and
 *       caching (streams/core/keystate.py: the key's mark and its recent ids; ids a hot key
 *       cannot keep spill to a second store), and writes the event's bytes unchanged to the
 *       output or the stale topic, keyed by the object key, with the CloudEvents headers
 *       (`cloudevent_headers`) and, when stale, `stale.reason`; all with exactly_once_v2.
 * </ol>
 *
 * <p>Arguments (key=value): bootstrap, input, app, output, stale, deadletter, deliveries, state,
 * threads, warm (1: first run the whole job once, untimed, with app id `app-warm` into the
 * `-warm` topics, so that the JIT has compiled it), instance, bucket, prefix, sources (comma
 * list; absent: every source), ttl (dedupe seconds), grace (a deleted key's mark, seconds;
 * default ttl), skew (max clock skew seconds), dataschema (`ce_dataschema`), maxbytes (the
 * event records' limit), bound.s3 / bound.gcs / bound.azure (events per delivery), caching (0:
 * the stores without a record cache; default 1), streams.NAME (any other Kafka Streams or
 * client setting, for experiments; none by default: Kafka Streams' own defaults).
 *
 * <p>Prints `first <epoch ms>` when the timed pass reads its first record, then `done <epoch ms>
 * deliveries= events= emitted= stale= duplicates= malformed= filtered=` once every delivery's
 * events are decided, then waits for a line on stdin and closes (committing). Dead-lettered
 * here though the pipeline reads them (the benchmark's input has none): Lambda-wrapped S3
 * records, S3 records with no sequencer, version, time or eTag (record-hash ids), GCS push
 * envelopes, base64 Azure bodies and BlobRenamed. Instance plugins are not applied.
 */
public final class SameJob {
  static final ObjectMapper JSON = new ObjectMapper();
  static final ObjectReader STRICT =
      JSON.reader().with(StreamReadFeature.STRICT_DUPLICATE_DETECTION);
  static final JsonNodeFactory NODES = JsonNodeFactory.instance;
  static final int MAX_NESTING = 3;
  static final Set<String> SNS_NOTIFICATION_FIELDS =
      Set.of(
          "Type",
          "MessageId",
          "TopicArn",
          "Subject",
          "Message",
          "Timestamp",
          "SignatureVersion",
          "Signature",
          "SigningCertURL",
          "UnsubscribeURL",
          "MessageAttributes");
  static final Set<String> SNS_MARKERS =
      Set.of(
          "Type",
          "MessageId",
          "TopicArn",
          "Subject",
          "Message",
          "Timestamp",
          "SignatureVersion",
          "Signature",
          "SigningCertURL",
          "UnsubscribeURL",
          "MessageAttributes",
          "Token",
          "SubscribeURL");
  static final String[][] AWS_PARTITIONS = {
    {"cn-", "aws-cn"},
    {"us-gov-", "aws-us-gov"},
    {"us-isob-", "aws-iso-b"},
    {"us-isof-", "aws-iso-f"},
    {"us-iso-", "aws-iso"},
    {"eu-isoe-", "aws-iso-e"},
    {"eusc-", "aws-eusc"},
  };
  static final Pattern STORAGE_ACCOUNT =
      Pattern.compile(
          "/providers/Microsoft\\.Storage/storageAccounts/([A-Za-z0-9]{3,24})(?:/|$)",
          Pattern.CASE_INSENSITIVE);
  static final int SEQUENCER_WIDTH = 64;
  /** streams.core.normalizers: MAX_BUCKET_BYTES, MAX_ID_BYTES, MAX_TOKEN_BYTES, key limits. */
  static final int MAX_BUCKET_BYTES = 255;
  static final int MAX_ID_BYTES = 1024;
  static final int MAX_TOKEN_BYTES = 1024;
  static final int MAX_KEY = 1024;
  /** streams.core.keystate.RECENT_IDS: ids kept in a key's record; older live ones spill. */
  static final int RECENT_IDS = 8;
  /** The raw record's headers a decision reads (streams.stages.normalize.DECISIVE_HEADERS). */
  static final Set<String> DECISIVE_HEADERS = Set.of("source", "header.x-appwrite-webhook-events");
  /** streams.engine.topics.RAW_MAX_MESSAGE_BYTES: a larger raw value is not parsed. */
  static final int RAW_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
  // streams.core.records: what one record costs in a batch of its own (`record_bytes`).
  static final int BATCH_HEADER_BYTES = 61;
  static final int RECORD_FRAMING_BYTES = 5 + 1 + 10 + 5 + 5 + 5 + 5;
  static final int HEADER_FRAMING_BYTES = 5 + 5;
  static final int STALE_REASON_BYTES = 4096;
  static final byte[] SPECVERSION = "1.0".getBytes(StandardCharsets.UTF_8);
  static final byte[] JSON_CONTENT = "application/json".getBytes(StandardCharsets.UTF_8);
  static final byte[] CREATED_TYPE = "storage.object.created".getBytes(StandardCharsets.UTF_8);
  static final byte[] DELETED_TYPE = "storage.object.deleted".getBytes(StandardCharsets.UTF_8);
  static final byte[] NORMALIZE = "normalize".getBytes(StandardCharsets.UTF_8);

  /** A delivery this job cannot read (the pipeline dead-letters it); the message says why. */
  static final class Malformed extends RuntimeException {
    Malformed(String message) {
      super(message, null, false, false);
    }
  }

  /** What the job is configured with: the bench's one instance and the stream's limits. */
  record Config(
      String instance,
      String bucket,
      String prefix,
      Set<String> sources,
      double ttl,
      double grace,
      double skew,
      byte[] dataschema,
      int maxBytes,
      Map<String, Integer> bounds,
      int ceFixedBytes) {

    static Config of(Map<String, String> args) {
      String bucket = args.getOrDefault("bucket", "");
      String sources = args.getOrDefault("sources", "");
      double ttl = Double.parseDouble(args.getOrDefault("ttl", "86400"));
      byte[] schema =
          args.getOrDefault("dataschema", "urn:storage-events:schema:file-event:v1")
              .getBytes(StandardCharsets.UTF_8);
      Map<String, Integer> bounds = new HashMap<>();
      bounds.put("s3", Integer.parseInt(args.getOrDefault("bound.s3", "10")));
      bounds.put("gcs", Integer.parseInt(args.getOrDefault("bound.gcs", "1")));
      bounds.put("azure", Integer.parseInt(args.getOrDefault("bound.azure", "10000")));
      // `_CE_FIXED_BYTES`: the CloudEvents headers without the instance, provider, id and
      // key: their names, the longest type and the longest RFC 3339 time.
      int fixed = 0;
      for (String[] header :
          new String[][] {
            {"ce_specversion", "1.0"},
            {"ce_id", ""},
            {"ce_type", "storage.object.deleted"},
            {"ce_source", "/storage-events//"},
            {"ce_subject", ""},
            {"ce_dataschema", new String(schema, StandardCharsets.UTF_8)},
            {"content-type", "application/json"},
            {"ce_time", "0000-12-31T23:59:59.999999Z"},
          }) {
        fixed += HEADER_FRAMING_BYTES + utf8(header[0]) + utf8(header[1]);
      }
      return new Config(
          args.getOrDefault("instance", "default"),
          bucket.isEmpty() || bucket.equals("*") ? null : bucket,
          args.getOrDefault("prefix", ""),
          sources.isEmpty() ? null : Set.of(sources.split(",")),
          ttl,
          Double.parseDouble(args.getOrDefault("grace", Double.toString(ttl))),
          Double.parseDouble(args.getOrDefault("skew", "300")),
          schema,
          Integer.parseInt(args.getOrDefault("maxbytes", Integer.toString(1024 * 1024))),
          bounds,
          fixed);
    }
  }

  /** Counters of one pass, read by its main thread to know when every delivery is decided. */
  static final class Progress {
    final long target;
    final AtomicLong first = new AtomicLong();
    final AtomicLong deliveries = new AtomicLong();
    final AtomicLong events = new AtomicLong();
    final AtomicLong malformed = new AtomicLong();
    final AtomicLong filtered = new AtomicLong();
    final AtomicLong emitted = new AtomicLong();
    final AtomicLong stale = new AtomicLong();
    final AtomicLong duplicates = new AtomicLong();

    Progress(long target) {
      this.target = target;
    }

    boolean done() {
      return deliveries.get() >= target
          && emitted.get() + stale.get() + duplicates.get() >= events.get();
    }
  }

  static int utf8(String text) {
    return text.getBytes(StandardCharsets.UTF_8).length;
  }
  // ---------------------------------------------------------------- ids (streams/normalizers/base)

  static final ThreadLocal<MessageDigest> SHA256 =
      ThreadLocal.withInitial(
          () -> {
            try {
              return MessageDigest.getInstance("SHA-256");
            } catch (NoSuchAlgorithmException e) {
              throw new IllegalStateException(e);
            }
          });

  /** `derived_id(provider, *parts)`: sha256 of orjson's compact JSON array, 32 hex digits. */
  static String derivedId(String provider, String... parts) {
    StringBuilder json = new StringBuilder(128).append('[');
    quote(json, provider);
    for (String part : parts) {
      json.append(',');
      if (part == null) {
        json.append("null");
      } else {
        quote(json, part);
      }
    }
    json.append(']');
    byte[] digest = SHA256.get().digest(json.toString().getBytes(StandardCharsets.UTF_8));
    StringBuilder id = new StringBuilder(provider.length() + 33).append(provider).append(':');
    for (int i = 0; i < 16; i++) {
      id.append(Character.forDigit((digest[i] >> 4) & 0xF, 16));
      id.append(Character.forDigit(digest[i] & 0xF, 16));
    }
    return id.toString();
  }

  /** A JSON string as orjson writes it: `"` `\` and control characters escaped, nothing else. */
  static void quote(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }


  /** A string field (a JSON string), else null: what `isinstance(value, str)` reads. */
  static String string(JsonNode node, String field) {
    JsonNode value = node == null ? null : node.get(field);
    return value != null && value.isTextual() ? value.textValue() : null;
  }

  /** `optional_str`: absent or null is null, a string is itself ("" too), else malformed. */
  static String optional(JsonNode node, String field, String what) {
    JsonNode value = node == null ? null : node.get(field);
    if (value == null || value.isNull()) {
      return null;
    }
    if (!value.isTextual()) {
      throw new Malformed(what + " is not a string: " + value);
    }
    return value.textValue();
  }

  /** `present`: an optional string where `""` counts as absent. */
  static String present(JsonNode node, String field, String what) {
    String value = optional(node, field, what);
    return value == null || value.isEmpty() ? null : value;
  }

  /** `require_str`: a non-empty string, else malformed. */
  static String require(JsonNode node, String field, String what) {
    JsonNode value = node == null ? null : node.get(field);
    if (value == null || !value.isTextual() || value.textValue().isEmpty()) {
      throw new Malformed(what + " is missing or not a string");
    }
    return value.textValue();
  }

  static ObjectNode requireObject(JsonNode value, String what) {
    if (value == null || !value.isObject()) {
      throw new Malformed(what + " is not a JSON object");
    }
    return (ObjectNode) value;
  }

  /** `optional_int`: a size as a JSON integer, an ASCII decimal string (at most 30 digits) or
   * an integral float; absent, null or "" is null; anything else malformed. */
  static JsonNode optionalInt(JsonNode value, String what) {
    if (value == null || value.isNull()) {
      return null;
    }
    if (value.isIntegralNumber()) {
      return value;
    }
    if (value.isTextual()) {
      String text = value.textValue();
      if (text.isEmpty()) {
        return null;
      }
      if (text.length() <= 30 && digits(text)) {
        return text.length() <= 18
            ? NODES.numberNode(Long.parseLong(text))
            : NODES.numberNode(new BigInteger(text));
      }
    }
    if (value.isFloatingPointNumber()) {
      double number = value.doubleValue();
      if (Double.isFinite(number) && number == Math.rint(number)) {
        return NODES.numberNode(value.decimalValue().toBigInteger());
      }
    }
    throw new Malformed(what + " is not an integer: " + value);
  }

  static boolean digits(String text) {
    if (text.isEmpty()) {
      return false;
    }
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (c < '0' || c > '9') {
        return false;
      }
    }
    return true;
  }

  /** `strip_quotes`: one pair of surrounding double quotes gone; "" or `""` alone is null. */
  static String stripQuotes(String etag) {
    if (etag != null && etag.length() >= 2 && etag.charAt(0) == '"' && etag.endsWith("\"")) {
      etag = etag.substring(1, etag.length() - 1);
    }
    return etag == null || etag.isEmpty() ? null : etag;
  }

  // ------------------------------------------------------------------------------ times

  /** An RFC 3339 time as UTC microseconds since the epoch (`parse_time`, fractions past the
   * sixth digit truncated), or null for absent / "". */
  static Long parseTime(JsonNode node, String field, String what) {
    JsonNode value = node == null ? null : node.get(field);
    if (value == null || value.isNull()) {
      return null;
    }
    if (!value.isTextual()) {
      throw new Malformed(what + " is not a string: " + value);
    }
    return parseTime(value.textValue(), what);
  }

  static Long parseTime(String text, String what) {
    if (text == null || text.isEmpty()) {
      return null;
    }
    try {
      OffsetDateTime parsed;
      try {
        parsed = OffsetDateTime.parse(text);
      } catch (DateTimeException offsetless) {
        parsed = LocalDateTime.parse(text).atOffset(ZoneOffset.UTC);
      }
      return parsed.toEpochSecond() * 1_000_000L + parsed.getNano() / 1000;
    } catch (DateTimeException | ArithmeticException e) {
      throw new Malformed(what + " is not an RFC 3339 time: " + text);
    }
  }

  /** `format_time`: RFC 3339 in UTC with a `Z`, microseconds only when present; with `z`
   * false, Python's `isoformat()` of the UTC time instead (`+00:00`, for stale reasons). */
  static String formatTime(long micros, boolean z) {
    long seconds = Math.floorDiv(micros, 1_000_000L);
    int fraction = (int) Math.floorMod(micros, 1_000_000L);
    LocalDateTime time = LocalDateTime.ofEpochSecond(seconds, 0, ZoneOffset.UTC);
    StringBuilder out = new StringBuilder(32);
    pad(out, time.getYear(), 4).append('-');
    pad(out, time.getMonthValue(), 2).append('-');
    pad(out, time.getDayOfMonth(), 2).append('T');
    pad(out, time.getHour(), 2).append(':');
    pad(out, time.getMinute(), 2).append(':');
    pad(out, time.getSecond(), 2);
    if (fraction != 0) {
      pad(out.append('.'), fraction, 6);
    }
    return out.append(z ? "Z" : "+00:00").toString();
  }

  static StringBuilder pad(StringBuilder out, int number, int width) {
    String digits = Integer.toString(number);
    for (int i = digits.length(); i < width; i++) {
      out.append('0');
    }
    return out.append(digits);
  }

  /** `datetime.timestamp()` of a UTC time: its microseconds over 1e6, rounded once. */
  static double epochSeconds(long micros) {
    return micros / 1e6;
  }

  // ------------------------------------------------------------------------------ reading

  static JsonNode parse(byte[] body, String what) {
    try {
      return JSON.readTree(body);
    } catch (IOException e) {
      throw new Malformed(what + " is not JSON");
    }
  }

  static JsonNode parse(String body, String what) {
    try {
      return JSON.readTree(body);
    } catch (IOException e) {
      throw new Malformed(what + " is not JSON");
    }
  }

  /** `refuse_repeated_names`: an SNS envelope that names a field twice in any of its objects
   * is malformed (its signature covers one reading). Only envelopes are read twice. */
  static void refuseRepeatedNames(Object text) {
    try {
      if (text instanceof byte[] bytes) {
        STRICT.readTree(bytes);
      } else {
        STRICT.readTree((String) text);
      }
    } catch (IOException e) {
      throw new Malformed("SNS message names a field twice");
    }
  }

  /** `%XX` sequences decoded as UTF-8 (strict: malformed on bad UTF-8; else replaced, as
   * `urllib.parse.unquote`); an invalid escape stays as it is. */
  static String percentDecode(String text, boolean strict) {
    if (text.indexOf('%') < 0) {
      return text;
    }
    ByteArrayOutputStream bytes = new ByteArrayOutputStream(text.length());
    StringBuilder out = new StringBuilder(text.length());
    int i = 0;
    while (i < text.length()) {
      char c = text.charAt(i);
      if (c == '%'
          && i + 2 < text.length()
          && hex(text.charAt(i + 1)) >= 0
          && hex(text.charAt(i + 2)) >= 0) {
        bytes.write(hex(text.charAt(i + 1)) * 16 + hex(text.charAt(i + 2)));
        i += 3;
        continue;
      }
      flush(bytes, out, strict);
      out.append(c);
      i++;
    }
    flush(bytes, out, strict);
    return out.toString();
  }

  static int hex(char c) {
    return Character.digit(c, 16) >= 0 && c < 128 ? Character.digit(c, 16) : -1;
  }

  static void flush(ByteArrayOutputStream bytes, StringBuilder out, boolean strict) {
    if (bytes.size() == 0) {
      return;
    }
    if (strict) {
      try {
        out.append(
            StandardCharsets.UTF_8
                .newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT)
                .decode(java.nio.ByteBuffer.wrap(bytes.toByteArray())));
      } catch (CharacterCodingException e) {
        throw new Malformed("key is not valid percent-encoded UTF-8");
      }
    } else {
      out.append(new String(bytes.toByteArray(), StandardCharsets.UTF_8));
    }
    bytes.reset();
  }

  /** `form_decode`: `+` is a space, then `%XX` is UTF-8 (strict). */
  static String formDecode(String key) {
    return percentDecode(key.replace('+', ' '), true);
  }

  // ---------------------------------------------------------------- ordering (core/ordering)

  static String awsToken(String sequencer) {
    String upper = sequencer.toUpperCase(java.util.Locale.ROOT);
    int width = Math.max(SEQUENCER_WIDTH, upper.length());
    StringBuilder padded = new StringBuilder(width).append(upper);
    while (padded.length() < width) {
      padded.append('0');
    }
    return padded.toString();
  }

  /** `ordering._int`: a JSON integer or an ASCII decimal string (here: one a long holds). */
  static Long gcsInt(JsonNode value) {
    if (value == null || value.isNull()) {
      return null;
    }
    if (value.isIntegralNumber() && value.canConvertToLong()) {
      return value.asLong();
    }
    if (value.isTextual()) {
      String text = value.textValue();
      if (text.length() <= 18 && digits(text)) {
        return Long.parseLong(text);
      }
      if (text.length() == 19 && digits(text) && text.compareTo("9223372036854775807") <= 0) {
        return Long.parseLong(text);
      }
    }
    return null;
  }

  /** (generation, created 0 / deleted 1, metageneration), fixed width: compares as a string. */
  static String gcsToken(long generation, String type, long metageneration) {
    return padded(generation) + (type.equals("created") ? ":0:" : ":1:") + padded(metageneration);
  }

  static String padded(long number) {
    String digits = Long.toString(number);
    return "0".repeat(Math.max(0, 19 - digits.length())) + digits;
  }

  /** `ordering.scope`: the provider, narrowed to the AWS partition or the Azure account. */
  static String scope(String provider, JsonNode raw) {
    if (provider.equals("azure")) {
      String origin = string(raw, "topic");
      if (origin == null || origin.isEmpty()) {
        JsonNode topic = raw == null ? null : raw.get("topic");
        boolean falsy = topic == null || topic.isNull() || (topic.isTextual() && origin.isEmpty())
            || (topic.isBoolean() && !topic.booleanValue())
            || (topic.isNumber() && topic.doubleValue() == 0)
            || (topic.isContainerNode() && topic.isEmpty());
        origin = falsy ? string(raw, "source") : null;
      }
      if (origin != null) {
        Matcher found = STORAGE_ACCOUNT.matcher(origin);
        if (found.find()) {
          return "azure@" + found.group(1).toLowerCase(java.util.Locale.ROOT);
        }
      }
      return provider;
    }
    if (provider.equals("s3")) {
      String region = string(raw, "awsRegion");
      if (region != null) {
        for (String[] partition : AWS_PARTITIONS) {
          if (region.startsWith(partition[0])) {
            return "s3@" + partition[1];
          }
        }
      }
    }
    return provider;
  }

  // ------------------------------------------------------------- the canonical event (core/event)

  /** One event as stage one builds it: the fields its checks read, and its JSON. */
  static final class Event {
    final String id;
    String key;
    final String bucket;
    final String provider;
    final String sequencer;
    final String versionId;
    final String etag;
    final ObjectNode json;

    Event(
        String id,
        String type,
        String key,
        String bucket,
        JsonNode size,
        String etag,
        String versionId,
        Long time,
        String sequencer,
        String provider,
        Boolean versionOnly,
        JsonNode raw) {
      this.id = id;
      this.key = key;
      this.bucket = bucket;
      this.provider = provider;
      this.sequencer = sequencer;
      this.versionId = versionId;
      this.etag = etag;
      // FileEvent's fields, in its order (what `event_json` writes).
      ObjectNode node = NODES.objectNode();
      node.put("id", id);
      node.put("type", type);
      node.put("key", key);
      node.put("bucket", bucket);
      node.set("size", size == null ? NODES.nullNode() : size);
      node.put("etag", etag);
      node.put("version_id", versionId);
      node.put("time", time == null ? null : formatTime(time, true));
      node.put("sequencer", sequencer);
      node.put("provider", provider);
      node.put("version_only", versionOnly);
      node.set("raw", raw == null ? NODES.nullNode() : raw);
      this.json = node;
    }

    void rekey(String relative) {
      key = relative;
      json.put("key", relative);
    }

    byte[] bytes() {
      try {
        return JSON.writeValueAsBytes(json);
      } catch (IOException e) {
        throw new Malformed("cannot serialise its event: " + e.getMessage());
      }
    }
  }

  // ---------------------------------------------------------------- S3 (core/normalizers/s3)

  static void s3(Object text, JsonNode body, int depth, List<Event> out) {
    if (!body.isObject()) {
      throw new Malformed("S3 notification is not a JSON object");
    }
    for (Iterator<String> names = body.fieldNames(); names.hasNext(); ) {
      if (SNS_MARKERS.contains(names.next())) {
        // Before Records: an envelope's payload is its signed Message, never a field beside it.
        refuseRepeatedNames(text);
        if (!"Notification".equals(string(body, "Type"))) {
          throw new Malformed("SNS message is not a notification");
        }
        for (Iterator<String> fields = body.fieldNames(); fields.hasNext(); ) {
          if (!SNS_NOTIFICATION_FIELDS.contains(fields.next())) {
            throw new Malformed("SNS envelope carries fields SNS does not send (unsigned)");
          }
        }
        String message = require(body, "Message", "SNS Message");
        if (depth >= MAX_NESTING) {
          throw new Malformed("SNS Message: more than " + MAX_NESTING + " nested envelopes");
        }
        s3(message, parse(message, "SNS Message"), depth + 1, out);
        return;
      }
    }
    JsonNode records = body.get("Records");
    if (records == null) {
      if ("s3:TestEvent".equals(string(body, "Event"))) {
        return;
      }
      throw new Malformed("S3 notification has no Records (and is no SNS envelope)");
    }
    if (!records.isArray()) {
      throw new Malformed("Records is not a JSON array");
    }
    int index = 0;
    for (JsonNode record : records) {
      String what = "Records[" + index++ + "]";
      if (!record.isObject()) {
        throw new Malformed(what + " is not a JSON object");
      }
      if (record.has("Sns") || "aws:sqs".equals(string(record, "eventSource"))) {
        throw new Malformed(what + ": Lambda-wrapped messages are not handled here");
      }
      s3Record((ObjectNode) record, what, out);
    }
  }

  static void s3Record(ObjectNode record, String what, List<Event> out) {
    JsonNode source = record.get("eventSource");
    if (source != null && !source.isNull() && !"aws:s3".equals(source.textValue())) {
      throw new Malformed(what + ".eventSource " + source + " is not one of ['aws:s3']");
    }
    String name = require(record, "eventName", what + ".eventName");
    String bare = name.startsWith("s3:") ? name.substring(3) : name;
    String kind;
    if (bare.startsWith("ObjectCreated:")) {
      kind = "created";
    } else if (bare.equals("ObjectRemoved:Delete") || bare.equals("LifecycleExpiration:Delete")) {
      kind = "version_delete";
    } else if (bare.equals("ObjectRemoved:DeleteMarkerCreated")
        || bare.equals("LifecycleExpiration:DeleteMarkerCreated")) {
      kind = "deleted";
    } else {
      return; // dropped before reading the object: bucket/metadata events lack one
    }
    ObjectNode s3 = requireObject(record.get("s3"), what + ".s3");
    ObjectNode bucketInfo = requireObject(s3.get("bucket"), what + ".s3.bucket");
    String bucket = require(bucketInfo, "name", what + ".s3.bucket.name");
    ObjectNode object = requireObject(s3.get("object"), what + ".s3.object");
    String key = formDecode(require(object, "key", what + ".s3.object.key"));
    String sequencer = present(object, "sequencer", what + ".s3.object.sequencer");
    String version = present(object, "versionId", what + ".s3.object.versionId");
    String eventTime = present(record, "eventTime", what + ".eventTime");
    String etag = present(object, "eTag", what + ".s3.object.eTag");
    String id;
    if (sequencer != null) {
      id = derivedId("s3", name, bucket, key, sequencer);
    } else if (version != null || eventTime != null || etag != null) {
      id = derivedId("s3", name, bucket, key, version, eventTime, etag);
    } else {
      throw new Malformed(what + ": no sequencer, version, time or eTag (record hash ids)");
    }
    JsonNode size = object.get("size");
    if (size != null && !size.isNull() && !size.isIntegralNumber()) {
      size = optionalInt(size, what + ".s3.object.size");
    }
    Long time = parseTime(eventTime, what + ".eventTime");
    Boolean versionOnly =
        kind.equals("created") ? null : kind.equals("version_delete") && version != null;
    out.add(
        new Event(
            id,
            kind.equals("created") ? "created" : "deleted",
            key,
            bucket,
            size == null || size.isNull() ? null : size,
            stripQuotes(etag),
            version,
            time,
            sequencer,
            "s3",
            versionOnly,
            record));
  }

  // -------------------------------------------------------------- GCS (core/normalizers/gcs)

  static void gcs(byte[] body, Map<String, String> attributes, List<Event> out) {
    ObjectNode payload = null;
    if (!new String(body, StandardCharsets.UTF_8).isBlank()) {
      JsonNode document = parse(body, "body");
      payload = requireObject(document, "body");
      if (payload.has("message")) {
        throw new Malformed("push envelopes are not handled here");
      }
    }
    String eventType = attributes.get("eventType");
    if (eventType == null || eventType.isEmpty()) {
      throw new Malformed("attribute eventType is missing or not a string");
    }
    String type;
    Boolean versionOnly;
    switch (eventType) {
      case "OBJECT_FINALIZE" -> {
        type = "created";
        versionOnly = null;
      }
      case "OBJECT_ARCHIVE" -> {
        type = "deleted";
        versionOnly = false;
      }
      case "OBJECT_DELETE" -> {
        type = "deleted";
        versionOnly = null;
      }
      default -> {
        return; // METADATA_UPDATE, INITIALIZE, unknown kinds: dropped on purpose
      }
    }
    String overwritten = attributes.get("overwrittenByGeneration");
    if (!eventType.equals("OBJECT_FINALIZE") && overwritten != null && !overwritten.isEmpty()) {
      return; // the old generation of an overwrite; the FINALIZE is the change
    }
    String bucket = agreeing(attributes, "bucketId", payload, "bucket");
    String key = agreeing(attributes, "objectId", payload, "name");
    String generation = generation(attributes, payload);
    Long time = parseTime(attributes.get("eventTime"), "attribute eventTime");
    if (time == null) {
      String fallback = type.equals("created") ? "updated" : "timeDeleted";
      time = parseTime(payload, fallback, "payload " + fallback);
    }
    ObjectNode raw = payload == null ? NODES.objectNode() : payload;
    ObjectNode attributeNode = raw.objectNode();
    attributes.forEach(attributeNode::put);
    JsonNode size = payload == null ? null : optionalInt(payload.get("size"), "payload size");
    String etag = payload == null ? null : optional(payload, "etag", "payload etag");
    raw.set("attributes", attributeNode);
    out.add(
        new Event(
            derivedId("gcs", eventType, bucket, key, generation),
            type,
            key,
            bucket,
            size,
            stripQuotes(etag),
            generation,
            time,
            generation,
            "gcs",
            versionOnly,
            raw));
  }

  static String agreeing(
      Map<String, String> attributes, String attribute, ObjectNode payload, String field) {
    String fromAttribute = attributes.get(attribute);
    if (fromAttribute != null && fromAttribute.isEmpty()) {
      fromAttribute = null;
    }
    String fromPayload = payload == null ? null : optional(payload, field, "payload " + field);
    if (fromPayload != null && fromPayload.isEmpty()) {
      fromPayload = null;
    }
    if (fromAttribute != null && fromPayload != null && !fromAttribute.equals(fromPayload)) {
      throw new Malformed(
          "attribute " + attribute + " differs from payload " + field);
    }
    String value = fromAttribute != null ? fromAttribute : fromPayload;
    if (value == null) {
      throw new Malformed("no " + attribute + " attribute and no payload " + field);
    }
    return value;
  }

  static String generation(Map<String, String> attributes, ObjectNode payload) {
    String fromAttribute = decimal(attributes.get("objectGeneration"), "attribute objectGeneration");
    JsonNode node = payload == null ? null : payload.get("generation");
    String fromPayload;
    if (node == null || node.isNull()) {
      fromPayload = null;
    } else if (node.isIntegralNumber() && node.bigIntegerValue().signum() >= 0) {
      fromPayload = node.bigIntegerValue().toString();
    } else if (node.isTextual()) {
      fromPayload = decimal(node.textValue(), "payload generation");
    } else {
      throw new Malformed("payload generation is not a generation number: " + node);
    }
    if (fromAttribute != null
        && fromPayload != null
        && !new BigInteger(fromAttribute).equals(new BigInteger(fromPayload))) {
      throw new Malformed("attribute objectGeneration differs from payload generation");
    }
    String value = fromAttribute != null ? fromAttribute : fromPayload;
    if (value == null) {
      throw new Malformed("no objectGeneration attribute and no payload generation");
    }
    return value;
  }

  static String decimal(String value, String what) {
    if (value == null || value.isEmpty()) {
      return null;
    }
    if (value.length() <= 20 && digits(value)) {
      return value;
    }
    throw new Malformed(what + " is not a generation number: " + value);
  }

  // ---------------------------------------------------------- Azure (core/normalizers/azure)

  static void azure(byte[] body, List<Event> out) {
    String stripped = new String(body, StandardCharsets.UTF_8).strip();
    if (stripped.isEmpty()) {
      throw new Malformed("body is empty");
    }
    if (stripped.charAt(0) != '{' && stripped.charAt(0) != '[') {
      throw new Malformed("base64 bodies are not handled here");
    }
    JsonNode document = parse(body, "body");
    List<JsonNode> events = new ArrayList<>();
    if (document.isObject()) {
      events.add(document);
    } else if (document.isArray()) {
      document.forEach(events::add);
    } else {
      throw new Malformed("body is neither an event object nor an array of events");
    }
    int index = 0;
    for (JsonNode value : events) {
      String where = "event " + index++;
      ObjectNode event = requireObject(value, where);
      boolean cloud =
          event.has("specversion") || event.has("specVersion") || !event.has("eventType");
      String typeField = cloud ? "type" : "eventType";
      if (!event.has(typeField)) {
        throw new Malformed(where + " has neither eventType (Event Grid) nor type (CloudEvents)");
      }
      String eventType = require(event, typeField, where + " " + typeField);
      boolean created = eventType.equals("Microsoft.Storage.BlobCreated");
      if (eventType.equals("Microsoft.Storage.BlobRenamed")) {
        throw new Malformed(where + ": BlobRenamed is not handled here");
      }
      if (!created && !eventType.equals("Microsoft.Storage.BlobDeleted")) {
        continue;
      }
      String id = require(event, "id", where + " id");
      String subject = require(event, "subject", where + " subject");
      String path = subject.startsWith("/") ? subject.substring(1) : subject;
      String prefix = "blobServices/default/containers/";
      String rest = path.startsWith(prefix) ? path.substring(prefix.length()) : path;
      int slash = rest.indexOf('/');
      String container = slash < 0 ? rest : rest.substring(0, slash);
      String tail = slash < 0 ? "" : rest.substring(slash + 1);
      if (!path.startsWith(prefix)
          || container.isEmpty()
          || slash < 0
          || !tail.startsWith("blobs/")
          || tail.equals("blobs/")) {
        throw new Malformed(where + " subject is not a blob path");
      }
      String key = tail.substring("blobs/".length());
      ObjectNode data = requireObject(event.get("data"), where + " data");
      String api = optional(data, "api", where + " data.api");
      if (created && ("CreateFile".equals(api) || "SftpCreate".equals(api))) {
        continue;
      }
      Long time = parseTime(event, cloud ? "time" : "eventTime", where + " time");
      String sequencer = optional(data, "sequencer", where + " data.sequencer");
      out.add(
          new Event(
              id,
              created ? "created" : "deleted",
              key,
              container,
              optionalInt(data.get("contentLength"), where + " data.contentLength"),
              stripQuotes(optional(data, "eTag", where + " data.eTag")),
              optional(data, "versionId", where + " data.versionId"),
              time,
              sequencer,
              "azure",
              null,
              event));
    }
  }

  // ------------------------------------------------------ bounds (core/normalizers/__init__)

  /** `check_bounds`: no field longer than any real one can be. */
  static void checkBounds(Event event) {
    int key =
        event.provider.equals("azure")
            ? event.key.codePointCount(0, event.key.length())
            : utf8(event.key);
    if (key > MAX_KEY) {
      throw new Malformed("object key of " + key + " is longer than the provider allows");
    }
    String[][] fields = {
      {"bucket name", event.bucket}, {"event id", event.id}, {"sequencer", event.sequencer},
      {"version id", event.versionId}, {"ETag", event.etag},
    };
    int[] most = {MAX_BUCKET_BYTES, MAX_ID_BYTES, MAX_TOKEN_BYTES, MAX_TOKEN_BYTES, MAX_TOKEN_BYTES};
    for (int i = 0; i < fields.length; i++) {
      if (fields[i][1] != null && fields[i][1].length() * 4 > most[i]) {
        int size = utf8(fields[i][1]);
        if (size > most[i]) {
          throw new Malformed(fields[i][0] + " of " + size + " bytes is over " + most[i] + " bytes");
        }
      }
    }
  }

  // ----------------------------------------------------------------- instance rules (core/rules)

  /** The event's key relative to the instance, or null when the instance does not keep it
   * (`apply_rules` without plugins: sources, bucket, prefix, prefix-escape). */
  static String kept(Config config, Event event) {
    if (config.sources() != null && !config.sources().contains(event.provider)) {
      return null;
    }
    if (config.bucket() != null && event.bucket != null && !event.bucket.equals(config.bucket())) {
      return null;
    }
    String prefix = config.prefix();
    if (prefix.isEmpty()) {
      return event.key;
    }
    String head = prefix + "/";
    if (!event.key.startsWith(head) || event.key.length() == head.length()) {
      return null;
    }
    String relative = event.key.substring(head.length());
    return escapesRoot(relative) ? null : relative;
  }

  static boolean namesARoot(String path) {
    if (path.isEmpty()) {
      return false;
    }
    char first = path.charAt(0);
    return first == '/'
        || first == '\\'
        || (path.length() > 1
            && path.charAt(1) == ':'
            && ((first >= 'A' && first <= 'Z') || (first >= 'a' && first <= 'z')));
  }

  static boolean leavesRoot(String path) {
    int depth = 0;
    for (String segment : path.split("/", -1)) {
      if (segment.equals("..")) {
        depth--;
        if (depth < 0) {
          return true;
        }
      } else if (!segment.isEmpty() && !segment.equals(".")) {
        depth++;
      }
    }
    return depth == 0;
  }

  static boolean escapesRoot(String relative) {
    if (namesARoot(relative)) {
      return true;
    }
    if (relative.indexOf('.') < 0 && relative.indexOf('%') < 0) {
      return relative.isEmpty();
    }
    String reading = relative;
    while (true) {
      if (namesARoot(reading)
          || leavesRoot(reading)
          || (reading.indexOf('\\') >= 0 && leavesRoot(reading.replace('\\', '/')))) {
        return true;
      }
      if (reading.indexOf('%') < 0) {
        return false;
      }
      String decoded = percentDecode(reading, false);
      if (decoded.equals(reading)) {
        return false;
      }
      reading = decoded;
    }
  }

  // ------------------------------------------------------------------ stage one (core/routing)

  /** What stage one forwards: a keyed record (to the repartition topic) or a dead letter
   * (its original key); split before either is written. */
  record Routed(byte[] key, boolean deadLetter) {}

  /** Stage one: a raw delivery -> its events' keyed records, or one dead letter. */
  static final class Parse implements Processor<byte[], byte[], Routed, byte[]> {
    private final Progress progress;
    private final Config config;
    private final byte[] instance;
    private ProcessorContext<Routed, byte[]> context;

    Parse(Progress progress, Config config) {
      this.progress = progress;
      this.config = config;
      this.instance = config.instance().getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public void init(ProcessorContext<Routed, byte[]> context) {
      this.context = context;
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      if (progress.first.get() == 0) {
        progress.first.compareAndSet(0, System.currentTimeMillis());
      }
      // The headers as the pipeline reads them (`headers_dict`: the last value of a name wins,
      // at the place of its first), and whether a name a decision reads comes twice.
      Map<String, byte[]> headers = new LinkedHashMap<>();
      boolean repeated = false;
      int count = 0;
      for (Header header : record.headers()) {
        count++;
        if (headers.put(header.key(), header.value()) != null
            && DECISIVE_HEADERS.contains(header.key())) {
          repeated = true;
        }
      }
      byte[] value = record.value() == null ? new byte[0] : record.value();
      byte[] source = headers.get("source");
      String sourceName = source == null ? "" : new String(source, StandardCharsets.UTF_8);
      List<byte[]> keyed = new ArrayList<>(1);
      String reason = null;
      try {
        if (value.length > RAW_MAX_MESSAGE_BYTES) {
          reason = "a value of " + value.length + " bytes is over the raw topics' limit";
        } else if (repeated) {
          reason = "repeated header(s): a decision reads exactly one";
        } else {
          keyed = route(sourceName, value, headers, count);
        }
      } catch (Malformed e) {
        reason = (sourceName.isEmpty() ? "?" : sourceName) + ": " + e.getMessage();
      }
      if (reason != null) {
        progress.malformed.incrementAndGet();
        Headers letter = new RecordHeaders();
        if (repeated) {
          for (Header header : record.headers()) {
            letter.add(header.key(), header.value() == null ? new byte[0] : header.value());
          }
        } else {
          headers.forEach(
              (name, content) -> {
                if (content != null) {
                  letter.add(name, content);
                }
              });
        }
        byte[] error = reason.getBytes(StandardCharsets.UTF_8);
        letter.add("error", error.length > 4096 ? java.util.Arrays.copyOf(error, 4096) : error);
        letter.add("error.stage", NORMALIZE);
        letter.add(
            "error.topic",
            context.recordMetadata().map(m -> m.topic()).orElse("").getBytes(StandardCharsets.UTF_8));
        context.forward(
            new Record<>(new Routed(record.key(), true), value, record.timestamp(), letter));
      } else {
        int events = keyed.size() / 2;
        progress.events.addAndGet(events);
        byte[] receivedAt = headers.get("received-at");
        for (int i = 0; i < keyed.size(); i += 2) {
          Headers out = new RecordHeaders();
          out.add("instance", instance);
          if (receivedAt != null && receivedAt.length > 0) {
            out.add("received-at", receivedAt);
          }
          context.forward(
              new Record<>(
                  new Routed(keyed.get(i), false), keyed.get(i + 1), record.timestamp(), out));
        }
      }
      progress.deliveries.incrementAndGet();
    }

    /** (partition key, event JSON) pairs of a delivery's kept events, flattened; malformed
     * when it cannot be read, holds more events than its provider sends in one, or one of its
     * records would be over the size bound (then none of them is written). */
    private List<byte[]> route(String source, byte[] value, Map<String, byte[]> headers, int n) {
      if (source.isEmpty()) {
        throw new Malformed("no `source` header and the topic has no default source");
      }
      List<Event> events = new ArrayList<>(1);
      switch (source) {
        case "s3" -> s3(value, parse(value, "body"), 0, events);
        case "gcs" -> {
          Map<String, String> attributes = new LinkedHashMap<>();
          headers.forEach(
              (name, content) -> {
                if (name.startsWith("attribute.")) {
                  attributes.put(
                      name.substring(10),
                      content == null ? "" : new String(content, StandardCharsets.UTF_8));
                }
              });
          gcs(value, attributes, events);
        }
        case "azure" -> azure(value, events);
        default -> throw new Malformed("unknown source " + source);
      }
      for (Event event : events) {
        checkBounds(event);
      }
      int bound = config.bounds().get(source);
      if (events.size() > bound) {
        throw new Malformed(events.size() + " events in one delivery, over the " + bound);
      }
      List<byte[]> keyed = new ArrayList<>(events.size() * 2);
      for (Event event : events) {
        String relative = kept(config, event);
        if (relative == null) {
          progress.filtered.incrementAndGet();
          continue;
        }
        if (!relative.equals(event.key)) {
          event.rekey(relative);
        }
        byte[] json = event.bytes();
        byte[] partitionKey =
            (config.instance() + "/" + (event.bucket == null ? "" : event.bucket) + "/" + event.key)
                .getBytes(StandardCharsets.UTF_8);
        int size = eventRecordBytes(event, json, partitionKey, headers.get("received-at"));
        if (size > config.maxBytes()) {
          throw new Malformed(
              "event makes a record of "
                  + size
                  + " bytes, over the "
                  + config.maxBytes()
                  + "-byte limit (max.message.bytes) of the repartition, output and stale topics");
        }
        keyed.add(partitionKey);
        keyed.add(json);
      }
      return keyed;
    }

    /** `event_record_bytes`: the largest record the event becomes (keyed, output, stale). */
    private int eventRecordBytes(Event event, byte[] json, byte[] partitionKey, byte[] receivedAt) {
      int keyedSize =
          BATCH_HEADER_BYTES
              + RECORD_FRAMING_BYTES
              + partitionKey.length
              + json.length
              + HEADER_FRAMING_BYTES
              + "instance".length()
              + instance.length;
      if (receivedAt != null && receivedAt.length > 0) {
        keyedSize += HEADER_FRAMING_BYTES + "received-at".length() + receivedAt.length;
      }
      int output =
          BATCH_HEADER_BYTES
              + RECORD_FRAMING_BYTES
              + 2 * utf8(event.key)
              + json.length
              + utf8(event.id)
              + instance.length
              + utf8(event.provider)
              + config.ceFixedBytes();
      int stale = output + HEADER_FRAMING_BYTES + "stale.reason".length() + STALE_REASON_BYTES;
      return Math.max(keyedSize, stale);
    }
  }

  // ----------------------------------------------------------------- key state (core/keystate)

  /** One key's state: its mark (the newest emitted event's order), recent ids, ETag. */
  static final class KeyState {
    boolean marked;
    String kind;
    String token;
    double time = Double.NaN;
    String markId;
    String markType;
    double forgetAt = Double.NaN;
    String etag;
    final List<String> ids = new ArrayList<>(RECENT_IDS + 1);
    final List<Double> expiries = new ArrayList<>(RECENT_IDS + 1);
    double spillUntil = Double.NaN;

    static KeyState decode(byte[] stored) {
      KeyState state = new KeyState();
      if (stored == null) {
        return state;
      }
      try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(stored))) {
        state.marked = in.readBoolean();
        if (state.marked) {
          state.kind = readOptional(in);
          state.token = readOptional(in);
          state.time = in.readDouble();
          state.markId = in.readUTF();
          state.markType = in.readUTF();
          state.forgetAt = in.readDouble();
        }
        state.etag = readOptional(in);
        int n = in.readUnsignedByte();
        for (int i = 0; i < n; i++) {
          state.ids.add(in.readUTF());
          state.expiries.add(in.readDouble());
        }
        state.spillUntil = in.readDouble();
      } catch (IOException e) {
        return new KeyState(); // unreadable: no mark, no ids
      }
      return state;
    }

    byte[] encode() {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream(128 + 48 * ids.size());
      try (DataOutputStream out = new DataOutputStream(bytes)) {
        out.writeBoolean(marked);
        if (marked) {
          writeOptional(out, kind);
          writeOptional(out, token);
          out.writeDouble(time);
          out.writeUTF(markId);
          out.writeUTF(markType);
          out.writeDouble(forgetAt);
        }
        writeOptional(out, etag);
        out.writeByte(ids.size());
        for (int i = 0; i < ids.size(); i++) {
          out.writeUTF(ids.get(i));
          out.writeDouble(expiries.get(i));
        }
        out.writeDouble(spillUntil);
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
      return bytes.toByteArray();
    }

    static String readOptional(DataInputStream in) throws IOException {
      return in.readBoolean() ? in.readUTF() : null;
    }

    static void writeOptional(DataOutputStream out, String text) throws IOException {
      out.writeBoolean(text != null);
      if (text != null) {
        out.writeUTF(text);
      }
    }

    boolean seen(String id, double now) {
      for (int i = 0; i < ids.size(); i++) {
        if (ids.get(i).equals(id) && expiries.get(i) > now) {
          return true;
        }
      }
      return false;
    }

    boolean spilled(double now) {
      return !Double.isNaN(spillUntil) && spillUntil > now;
    }

    /** Record a new id, drop expired ones; the ids (and expiries) that no longer fit. */
    List<Object[]> remember(String id, double expiresAt, double now) {
      for (int i = ids.size() - 1; i >= 0; i--) {
        if (expiries.get(i) <= now) {
          ids.remove(i);
          expiries.remove(i);
        }
      }
      ids.add(id);
      expiries.add(expiresAt);
      List<Object[]> spilled = List.of();
      if (ids.size() > RECENT_IDS) {
        spilled = new ArrayList<>();
        while (ids.size() > RECENT_IDS) {
          double expiry = expiries.remove(0);
          spilled.add(new Object[] {ids.remove(0), expiry});
          if (Double.isNaN(spillUntil) || expiry > spillUntil) {
            spillUntil = expiry;
          }
        }
      }
      return spilled;
    }
  }

  // ---------------------------------------------------------------- stage two (core/emitting)

  /** Stage two: dedupe on the key's recent ids (then `seen` for a hot key's spilled ones),
   * order against the key's mark, and pass the event's bytes on, with the CloudEvents
   * headers, to the output or (with `stale.reason`) the stale topic. */
  static final class Decide implements Processor<byte[], byte[], byte[], byte[]> {
    private final Progress progress;
    private final Config config;
    private ProcessorContext<byte[], byte[]> context;
    private KeyValueStore<String, byte[]> keys;
    private KeyValueStore<String, byte[]> seen;
    private final Map<String, byte[]> sources = new HashMap<>();

    Decide(Progress progress, Config config) {
      this.progress = progress;
      this.config = config;
    }

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
      this.context = context;
      this.keys = context.getStateStore("keys");
      this.seen = context.getStateStore("seen");
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      JsonNode event;
      try {
        event = JSON.readTree(record.value());
      } catch (IOException e) {
        throw new IllegalStateException("unreadable keyed record", e);
      }
      Header instanceHeader = record.headers().lastHeader("instance");
      String instance = new String(instanceHeader.value(), StandardCharsets.UTF_8);
      String id = event.get("id").textValue();
      String type = event.get("type").textValue();
      String key = event.get("key").textValue();
      String bucket = string(event, "bucket");
      String provider = event.get("provider").textValue();
      String sequencer = string(event, "sequencer");
      String timeText = string(event, "time");
      JsonNode versionOnlyNode = event.get("version_only");
      boolean versionOnly = versionOnlyNode != null && versionOnlyNode.asBoolean(false);
      String etag = string(event, "etag");
      JsonNode raw = event.get("raw");
      Long micros = timeText == null ? null : parseTime(timeText, "time");
      double time = micros == null ? Double.NaN : epochSeconds(micros);

      double now = System.currentTimeMillis() / 1000.0;
      String eventScope = scope(provider, raw);
      String keyKey = instance + "|" + eventScope + "|" + (bucket == null ? "" : bucket) + "/" + key;
      KeyState state = KeyState.decode(keys.get(keyKey));

      // 1. Dedupe: the key's recent ids, then (a hot key's) the spilled ones.
      if (state.seen(id, now)) {
        progress.duplicates.incrementAndGet();
        return;
      }
      if (state.spilled(now)) {
        byte[] expiry = seen.get(instance + "|" + eventScope + "|" + id);
        if (expiry != null && Double.parseDouble(new String(expiry, StandardCharsets.US_ASCII)) > now) {
          progress.duplicates.incrementAndGet();
          return;
        }
      }
      for (Object[] spilled : state.remember(id, now + config.ttl(), now)) {
        seen.put(
            instance + "|" + eventScope + "|" + spilled[0],
            String.format(java.util.Locale.ROOT, "%.3f", (Double) spilled[1]).getBytes(StandardCharsets.US_ASCII));
      }

      // 2. Order against the key's mark (`mark_for`, `forgotten`, `bounded_mark`).
      String kind = null;
      String token = null;
      if (sequencer != null && !sequencer.isEmpty() && provider.equals("s3")) {
        kind = "aws-sequencer";
        token = awsToken(sequencer);
      } else if (sequencer != null && !sequencer.isEmpty() && provider.equals("azure")) {
        kind = "azure-sequencer";
        token = sequencer;
      } else if (provider.equals("gcs")) {
        Long generation = gcsInt(sequencer == null ? null : NODES.textNode(sequencer));
        if (generation != null) {
          Long meta = gcsInt(raw == null ? null : raw.get("metageneration"));
          kind = "gcs-generation";
          token = gcsToken(generation, type, meta == null ? 0 : meta);
        }
      }
      double latest = now + config.skew();
      boolean last = state.marked;
      if (last && state.markType.equals("deleted") && !Double.isNaN(state.forgetAt)
          && state.forgetAt <= now) {
        last = false; // a deleted key past its grace: as if never seen
      }
      double lastTime = last && state.time <= latest ? state.time : Double.NaN;
      String reason = null;
      if (last) {
        if (kind != null && kind.equals(state.kind) && token != null && state.token != null) {
          if (token.compareTo(state.token) < 0) {
            reason = kind + " " + sequencer + " is older than that of the emitted "
                + state.markType + " event " + state.markId;
          }
        } else if (!Double.isNaN(time) && !Double.isNaN(lastTime) && time < lastTime) {
          reason = "event time " + formatTime(micros, false)
              + " is older than that of the emitted " + state.markType + " event "
              + state.markId;
        }
      }
      Headers headers = cloudEvent(instance, id, type, provider, key, timeText);
      if (reason != null) {
        keys.put(keyKey, state.encode());
        headers.add("stale.reason", reason.getBytes(StandardCharsets.UTF_8));
        context.forward(
            new Record<>(key.getBytes(StandardCharsets.UTF_8), record.value(),
                record.timestamp(), headers));
        progress.stale.incrementAndGet();
        return;
      }

      // 3. Emit; a deleted noncurrent version leaves the key's mark as it is.
      if (!(type.equals("deleted") && versionOnly)) {
        // `recorded_mark`: a time beyond the skew bound keeps the key's time; `with_grace`.
        double recorded = !Double.isNaN(time) && time > latest ? (last ? lastTime : Double.NaN) : time;
        state.marked = true;
        state.kind = kind;
        state.token = token;
        state.time = recorded;
        state.markId = id;
        state.markType = type;
        state.forgetAt = type.equals("deleted") ? now + config.grace() : Double.NaN;
        state.etag = etag;
      }
      keys.put(keyKey, state.encode());
      context.forward(
          new Record<>(key.getBytes(StandardCharsets.UTF_8), record.value(), record.timestamp(),
              headers));
      progress.emitted.incrementAndGet();
    }

    /** `cloudevent_headers`: CloudEvents 1.0 Kafka binding, binary mode. */
    private Headers cloudEvent(
        String instance, String id, String type, String provider, String key, String time) {
      Headers headers = new RecordHeaders();
      headers.add("ce_specversion", SPECVERSION);
      headers.add("ce_id", id.getBytes(StandardCharsets.UTF_8));
      headers.add("ce_type", type.equals("created") ? CREATED_TYPE : DELETED_TYPE);
      headers.add(
          "ce_source",
          sources.computeIfAbsent(
              instance + "\0" + provider,
              unused ->
                  ("/storage-events/" + instance + "/" + provider)
                      .getBytes(StandardCharsets.UTF_8)));
      headers.add("ce_subject", key.getBytes(StandardCharsets.UTF_8));
      headers.add("ce_dataschema", config.dataschema());
      headers.add("content-type", JSON_CONTENT);
      if (time != null) {
        headers.add("ce_time", time.getBytes(StandardCharsets.UTF_8));
      }
      return headers;
    }
  }

  // ------------------------------------------------------------------------------ running

  static KafkaStreams streams(Map<String, String> args, String suffix, Progress progress) {
    String stale = args.get("stale") + suffix;
    String output = args.get("output") + suffix;
    String deadLetter = args.get("deadletter") + suffix;
    int partitions = Integer.parseInt(args.getOrDefault("partitions", "4"));
    Config config = Config.of(args);
    StreamsBuilder builder = new StreamsBuilder();
    boolean caching = !args.getOrDefault("caching", "1").equals("0");
    for (String store : List.of("keys", "seen")) {
      var builderOf =
          Stores.keyValueStoreBuilder(
              Stores.persistentKeyValueStore(store), Serdes.String(), Serdes.ByteArray());
      builder.addStateStore(
          (caching ? builderOf.withCachingEnabled() : builderOf.withCachingDisabled())
              .withLoggingEnabled(Map.of()));
    }
    Map<String, KStream<Routed, byte[]>> routed =
        builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .process(() -> new Parse(progress, config), Named.as("normalize"))
            .split(Named.as("routed-"))
            .branch((key, value) -> key.deadLetter(), Branched.as("dead-letter"))
            .defaultBranch(Branched.as("keyed"));
    routed
        .get("routed-dead-letter")
        .map((key, value) -> KeyValue.pair(key.key(), value), Named.as("dead-letter-key"))
        .to(deadLetter, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    routed
        .get("routed-keyed")
        .map((key, value) -> KeyValue.pair(key.key(), value), Named.as("partition-key"))
        .repartition(
            Repartitioned.with(Serdes.ByteArray(), Serdes.ByteArray())
                .withName("by-key")
                .withNumberOfPartitions(partitions))
        .process(() -> new Decide(progress, config), Named.as("emit"), "keys", "seen")
        .to(
            (key, value, context) ->
                context.headers().lastHeader("stale.reason") != null ? stale : output,
            Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("app") + suffix);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state"));
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.getOrDefault("threads", "1"));
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    args.forEach(
        (name, value) -> {
          if (name.startsWith("streams.")) { // any other Kafka Streams or client setting
            props.put(name.substring("streams.".length()), value);
          }
        });
    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    streams.setUncaughtExceptionHandler(
        exception -> {
          System.err.println("stream thread failed: " + exception);
          exception.printStackTrace();
          System.exit(2);
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_APPLICATION;
        });
    return streams;
  }

  static Progress pass(Map<String, String> args, String suffix, boolean timed)
      throws IOException, InterruptedException {
    Progress progress = new Progress(Long.parseLong(args.get("deliveries")));
    KafkaStreams streams = streams(args, suffix, progress);
    streams.start();
    boolean announced = false;
    while (!progress.done()) {
      if (timed && !announced && progress.first.get() != 0) {
        System.out.println("first " + progress.first.get());
        System.out.flush();
        announced = true;
      }
      Thread.sleep(5);
    }
    long done = System.currentTimeMillis();
    if (timed) {
      if (!announced) {
        System.out.println("first " + progress.first.get());
      }
      System.out.printf(
          "done %d deliveries=%d events=%d emitted=%d stale=%d duplicates=%d malformed=%d"
              + " filtered=%d%n",
          done,
          progress.deliveries.get(),
          progress.events.get(),
          progress.emitted.get(),
          progress.stale.get(),
          progress.duplicates.get(),
          progress.malformed.get(),
          progress.filtered.get());
      System.out.flush();
      new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
    } else {
      System.out.printf("warm pass done in %d ms%n", done - progress.first.get());
      System.out.flush();
    }
    streams.close();
    return progress;
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new HashMap<>();
    for (String arg : argv) {
      int eq = arg.indexOf('=');
      args.put(arg.substring(0, eq), arg.substring(eq + 1));
    }
    for (String required :
        List.of("bootstrap", "input", "app", "output", "stale", "deadletter", "deliveries", "state")) {
      if (!args.containsKey(required)) {
        System.err.println("missing argument " + required + "=...");
        System.exit(64);
      }
    }
    if (args.getOrDefault("warm", "1").equals("1")) {
      pass(args, "-warm", false);
    }
    pass(args, "", true);
  }
}
