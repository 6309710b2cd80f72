package dev.storageevents.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
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
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The pipeline's job (streams/) on Kafka Streams, for `make bench`: parse each raw record by
 * its `source` header into events with the pipeline's ids (streams/normalizers s3, gcs, azure:
 * the shapes benchmarks/pipeline.py generates), repartition by object key, dedupe on (scope,
 * id) in a RocksDB store with a changelog, order per (scope, bucket, key) in a second one
 * (streams/ordering.py's comparisons), and emit to the output or the stale topic, with
 * exactly_once_v2.
 *
 * <p>Arguments (key=value): bootstrap, input, app, output, stale, deliveries, state, threads,
 * warm (1: first run the whole job once, untimed, with app id `app-warm` into `output-warm` /
 * `stale-warm`, so that the JIT has compiled it), ttl (dedupe seconds, 86400).
 *
 * <p>Prints `first <epoch ms>` when the timed pass reads its first record, then `done <epoch ms>
 * deliveries= events= emitted= stale= duplicates= malformed=` once every delivery's events are
 * decided, then waits for a line on stdin and closes (committing). Not handled (dead-lettered
 * by the pipeline, counted as malformed here): Lambda-wrapped S3 records, record-hash S3 ids,
 * GCS push envelopes, Azure base64 bodies and BlobRenamed; the benchmark's input has none.
 */
public final class SameJob {
  static final ObjectMapper JSON = new ObjectMapper();
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
  static final double MAX_CLOCK_SKEW_S = 300;

  /** A delivery this job cannot read (the pipeline dead-letters it). */
  static final class Malformed extends RuntimeException {
    Malformed(String message) {
      super(message, null, false, false);
    }
  }

  /** One event, as stage one hands it to stage two (its JSON is the keyed record's value). */
  record Event(
      String id,
      String type,
      String bucket,
      String key,
      String provider,
      String scope,
      String sequencer,
      String kind,
      String token,
      Double time,
      boolean versionOnly) {

    byte[] json() {
      ObjectNode node = JSON.createObjectNode();
      node.put("id", id).put("type", type).put("bucket", bucket).put("key", key);
      node.put("provider", provider).put("scope", scope).put("sequencer", sequencer);
      node.put("kind", kind).put("token", token).put("time", time);
      node.put("version_only", versionOnly);
      try {
        return JSON.writeValueAsBytes(node);
      } catch (Exception e) {
        throw new IllegalStateException(e);
      }
    }

    static Event of(byte[] json) {
      try {
        JsonNode n = JSON.readTree(json);
        JsonNode time = n.get("time");
        return new Event(
            n.get("id").asText(),
            n.get("type").asText(),
            n.get("bucket").asText(),
            n.get("key").asText(),
            n.get("provider").asText(),
            n.get("scope").asText(),
            text(n, "sequencer"),
            text(n, "kind"),
            text(n, "token"),
            time == null || time.isNull() ? null : time.asDouble(),
            n.get("version_only").asBoolean());
      } catch (java.io.IOException e) {
        throw new IllegalStateException(e);
      }
    }
  }

  /** Counters of one pass, read by its main thread to know when every delivery is decided. */
  static final class Progress {
    final long target;
    final AtomicLong first = new AtomicLong();
    final AtomicLong deliveries = new AtomicLong();
    final AtomicLong events = new AtomicLong();
    final AtomicLong malformed = new AtomicLong();
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

  static String text(JsonNode node, String field) {
    JsonNode value = node == null ? null : node.get(field);
    return value == null || value.isNull() ? null : value.asText();
  }

  /** A string field where `""` counts as absent (base.present). */
  static String present(JsonNode node, String field) {
    String value = text(node, field);
    return value == null || value.isEmpty() ? null : value;
  }

  static String require(JsonNode node, String field) {
    JsonNode value = node == null ? null : node.get(field);
    if (value == null || !value.isTextual() || value.asText().isEmpty()) {
      throw new Malformed(field + " is not a non-empty string");
    }
    return value.asText();
  }

  static Double seconds(String time) {
    if (time == null || time.isEmpty()) {
      return null;
    }
    try {
      OffsetDateTime parsed = OffsetDateTime.parse(time);
      // Python truncates fractions to microseconds; so does this.
      return parsed.toEpochSecond() + (parsed.getNano() / 1000) / 1e6;
    } catch (RuntimeException e) {
      throw new Malformed("not a time: " + time);
    }
  }

  static JsonNode parse(byte[] body) {
    try {
      return JSON.readTree(body);
    } catch (java.io.IOException e) {
      throw new Malformed("not JSON");
    }
  }

  static JsonNode parse(String body) {
    try {
      return JSON.readTree(body);
    } catch (java.io.IOException e) {
      throw new Malformed("not JSON");
    }
  }

  // --------------------------------------------------------- ordering (streams/ordering.py)

  static String awsToken(String sequencer) {
    String upper = sequencer.toUpperCase(java.util.Locale.ROOT);
    int width = Math.max(SEQUENCER_WIDTH, upper.length());
    StringBuilder padded = new StringBuilder(width).append(upper);
    while (padded.length() < width) {
      padded.append('0');
    }
    return padded.toString();
  }

  /** A GCS int: a JSON number or an ASCII decimal string of at most 20 digits; else null. */
  static Long gcsInt(JsonNode value) {
    if (value == null || value.isNull()) {
      return null;
    }
    if (value.isIntegralNumber()) {
      return value.asLong();
    }
    if (value.isTextual()) {
      String text = value.asText();
      if (!text.isEmpty() && text.length() <= 19 && text.chars().allMatch(c -> c >= '0' && c <= '9')) {
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

  static String s3Scope(JsonNode record) {
    String region = text(record, "awsRegion");
    if (region != null) {
      for (String[] partition : AWS_PARTITIONS) {
        if (region.startsWith(partition[0])) {
          return "s3@" + partition[1];
        }
      }
    }
    return "s3";
  }

  static String azureScope(JsonNode event) {
    String origin = text(event, "topic");
    if (origin == null || origin.isEmpty()) {
      origin = text(event, "source");
    }
    if (origin != null) {
      Matcher found = STORAGE_ACCOUNT.matcher(origin);
      if (found.find()) {
        return "azure@" + found.group(1).toLowerCase(java.util.Locale.ROOT);
      }
    }
    return "azure";
  }

  // ---------------------------------------------------------------- S3 (streams/normalizers/s3)

  static void s3(JsonNode body, int depth, List<Event> out) {
    if (!body.isObject()) {
      throw new Malformed("S3 notification is not a JSON object");
    }
    for (Iterator<String> names = body.fieldNames(); names.hasNext(); ) {
      if (SNS_MARKERS.contains(names.next())) {
        if (!"Notification".equals(text(body, "Type"))) {
          throw new Malformed("SNS message is not a notification");
        }
        for (Iterator<String> fields = body.fieldNames(); fields.hasNext(); ) {
          if (!SNS_NOTIFICATION_FIELDS.contains(fields.next())) {
            throw new Malformed("SNS envelope carries fields SNS does not send");
          }
        }
        JsonNode message = body.get("Message");
        if (message == null || !message.isTextual()) {
          throw new Malformed("SNS Message is not a string");
        }
        if (depth >= MAX_NESTING) {
          throw new Malformed("too many nested envelopes");
        }
        s3(parse(message.asText()), depth + 1, out);
        return;
      }
    }
    JsonNode records = body.get("Records");
    if (records == null) {
      if ("s3:TestEvent".equals(text(body, "Event"))) {
        return;
      }
      throw new Malformed("S3 notification has no Records");
    }
    if (!records.isArray()) {
      throw new Malformed("Records is not a JSON array");
    }
    for (JsonNode record : records) {
      if (!record.isObject() || record.has("Sns") || "aws:sqs".equals(text(record, "eventSource"))) {
        throw new Malformed("not a bare S3 record (Lambda wrappers are not handled here)");
      }
      s3Record(record, out);
    }
  }

  static void s3Record(JsonNode record, List<Event> out) {
    String source = text(record, "eventSource");
    if (source != null && !source.equals("aws:s3")) {
      throw new Malformed("eventSource is not aws:s3");
    }
    String name = require(record, "eventName");
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
      return;
    }
    JsonNode s3 = record.get("s3");
    JsonNode object = s3 == null ? null : s3.get("object");
    String bucket = require(s3 == null ? null : s3.get("bucket"), "name");
    String key = formDecode(require(object, "key"));
    String sequencer = present(object, "sequencer");
    String version = present(object, "versionId");
    String eventTime = present(record, "eventTime");
    String etag = present(object, "eTag");
    String id;
    if (sequencer != null) {
      id = derivedId("s3", name, bucket, key, sequencer);
    } else if (version != null || eventTime != null || etag != null) {
      id = derivedId("s3", name, bucket, key, version, eventTime, etag);
    } else {
      throw new Malformed("an S3 record with no sequencer, version, time or eTag");
    }
    boolean versionOnly = kind.equals("version_delete") && version != null;
    String type = kind.equals("created") ? "created" : "deleted";
    out.add(
        new Event(
            id,
            type,
            bucket,
            key,
            "s3",
            s3Scope(record),
            sequencer,
            sequencer == null ? null : "aws-sequencer",
            sequencer == null ? null : awsToken(sequencer),
            seconds(eventTime),
            versionOnly));
  }

  static String formDecode(String key) {
    if (key.indexOf('+') < 0 && key.indexOf('%') < 0) {
      return key;
    }
    try {
      return URLDecoder.decode(key, StandardCharsets.UTF_8);
    } catch (IllegalArgumentException e) {
      throw new Malformed("key is not valid percent-encoded UTF-8");
    }
  }

  // -------------------------------------------------------------- GCS (streams/normalizers/gcs)

  static void gcs(byte[] body, Map<String, String> attributes, List<Event> out) {
    String eventType = attributes.get("eventType");
    if (eventType == null) {
      throw new Malformed("no eventType attribute");
    }
    String type;
    boolean versionOnly = false;
    switch (eventType) {
      case "OBJECT_FINALIZE" -> type = "created";
      case "OBJECT_ARCHIVE", "OBJECT_DELETE" -> type = "deleted";
      default -> {
        return;
      }
    }
    String overwritten = attributes.get("overwrittenByGeneration");
    if (!eventType.equals("OBJECT_FINALIZE") && overwritten != null && !overwritten.isEmpty()) {
      return;
    }
    JsonNode payload = null;
    if (new String(body, StandardCharsets.UTF_8).strip().length() > 0) {
      payload = parse(body);
      if (!payload.isObject() || payload.has("message")) {
        throw new Malformed("not a pull delivery's object resource (push is not handled here)");
      }
    }
    String bucket = agreeing(attributes.get("bucketId"), present(payload, "bucket"), "bucket");
    String key = agreeing(attributes.get("objectId"), present(payload, "name"), "name");
    String fromAttribute = attributes.get("objectGeneration");
    JsonNode fromPayload = payload == null ? null : payload.get("generation");
    String generation =
        fromAttribute != null && !fromAttribute.isEmpty()
            ? fromAttribute
            : fromPayload == null || fromPayload.isNull() ? null : fromPayload.asText();
    if (generation == null || generation.isEmpty()) {
      throw new Malformed("no generation");
    }
    String time = attributes.get("eventTime");
    if (time == null || time.isEmpty()) {
      time = text(payload, type.equals("created") ? "updated" : "timeDeleted");
    }
    Long number = gcsInt(JSON.getNodeFactory().textNode(generation));
    Long meta = payload == null ? null : gcsInt(payload.get("metageneration"));
    out.add(
        new Event(
            derivedId("gcs", eventType, bucket, key, generation),
            type,
            bucket,
            key,
            "gcs",
            "gcs",
            generation,
            number == null ? null : "gcs-generation",
            number == null ? null : gcsToken(number, type, meta == null ? 0 : meta),
            seconds(time),
            versionOnly));
  }

  static String agreeing(String attribute, String payload, String what) {
    if (attribute != null && attribute.isEmpty()) {
      attribute = null;
    }
    if (attribute != null && payload != null && !attribute.equals(payload)) {
      throw new Malformed("attribute and payload " + what + " differ");
    }
    String value = attribute != null ? attribute : payload;
    if (value == null) {
      throw new Malformed("no " + what);
    }
    return value;
  }

  // ---------------------------------------------------------- Azure (streams/normalizers/azure)

  static void azure(byte[] body, List<Event> out) {
    JsonNode document = parse(body);
    List<JsonNode> events = new ArrayList<>();
    if (document.isObject()) {
      events.add(document);
    } else if (document.isArray()) {
      document.forEach(events::add);
    } else {
      throw new Malformed("neither an event nor an array of events");
    }
    for (JsonNode event : events) {
      if (!event.isObject()) {
        throw new Malformed("event is not an object");
      }
      boolean cloud = event.has("specversion") || event.has("specVersion") || !event.has("eventType");
      String eventType = require(event, cloud ? "type" : "eventType");
      if (eventType.equals("Microsoft.Storage.BlobRenamed")) {
        throw new Malformed("BlobRenamed is not handled here");
      }
      boolean created = eventType.equals("Microsoft.Storage.BlobCreated");
      if (!created && !eventType.equals("Microsoft.Storage.BlobDeleted")) {
        continue;
      }
      String id = require(event, "id");
      String subject = require(event, "subject");
      String path = subject.startsWith("/") ? subject.substring(1) : subject;
      String prefix = "blobServices/default/containers/";
      if (!path.startsWith(prefix)) {
        throw new Malformed("subject is not a blob path");
      }
      String rest = path.substring(prefix.length());
      int slash = rest.indexOf('/');
      if (slash <= 0 || !rest.startsWith("blobs/", slash + 1) || rest.length() == slash + 7) {
        throw new Malformed("subject is not a blob path");
      }
      String container = rest.substring(0, slash);
      String key = rest.substring(slash + 7);
      JsonNode data = event.get("data");
      if (data == null || !data.isObject()) {
        throw new Malformed("data is not an object");
      }
      String api = text(data, "api");
      if (created && ("CreateFile".equals(api) || "SftpCreate".equals(api))) {
        continue;
      }
      String sequencer = text(data, "sequencer");
      boolean token = sequencer != null && !sequencer.isEmpty();
      out.add(
          new Event(
              id,
              created ? "created" : "deleted",
              container,
              key,
              "azure",
              azureScope(event),
              sequencer,
              token ? "azure-sequencer" : null,
              token ? sequencer : null,
              seconds(text(event, cloud ? "time" : "eventTime")),
              false));
    }
  }

  // ------------------------------------------------------------------------ the two stages

  /** Stage one: a raw delivery -> its events, keyed by object key (to be repartitioned). */
  static final class Parse implements Processor<byte[], byte[], byte[], byte[]> {
    private final Progress progress;
    private ProcessorContext<byte[], byte[]> context;

    Parse(Progress progress) {
      this.progress = progress;
    }

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
      this.context = context;
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      if (progress.first.get() == 0) {
        progress.first.compareAndSet(0, System.currentTimeMillis());
      }
      List<Event> events = new ArrayList<>(1);
      try {
        Header sourceHeader = record.headers().lastHeader("source");
        String source =
            sourceHeader == null ? "" : new String(sourceHeader.value(), StandardCharsets.UTF_8);
        switch (source) {
          case "s3" -> s3(parse(record.value()), 0, events);
          case "gcs" -> {
            Map<String, String> attributes = new HashMap<>();
            for (Header header : record.headers()) {
              if (header.key().startsWith("attribute.")) {
                attributes.put(
                    header.key().substring(10), new String(header.value(), StandardCharsets.UTF_8));
              }
            }
            gcs(record.value(), attributes, events);
          }
          case "azure" -> azure(record.value(), events);
          default -> throw new Malformed("unknown source " + source);
        }
      } catch (Malformed e) {
        progress.malformed.incrementAndGet();
        events.clear();
      }
      progress.events.addAndGet(events.size());
      for (Event event : events) {
        Headers headers = new RecordHeaders();
        headers.add("ce_id", event.id().getBytes(StandardCharsets.UTF_8));
        byte[] key = (event.bucket() + "/" + event.key()).getBytes(StandardCharsets.UTF_8);
        context.forward(new Record<>(key, event.json(), record.timestamp(), headers));
      }
      progress.deliveries.incrementAndGet();
    }
  }

  /** Stage two: dedupe on (scope, id), order per (scope, bucket, key), emit or stale. */
  static final class Decide implements Processor<byte[], byte[], byte[], byte[]> {
    private final Progress progress;
    private final double ttl;
    private ProcessorContext<byte[], byte[]> context;
    private KeyValueStore<String, byte[]> seen;
    private KeyValueStore<String, byte[]> marks;

    Decide(Progress progress, double ttl) {
      this.progress = progress;
      this.ttl = ttl;
    }

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
      this.context = context;
      this.seen = context.getStateStore("seen");
      this.marks = context.getStateStore("marks");
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      Event event = Event.of(record.value());
      double now = System.currentTimeMillis() / 1000.0;
      String idKey = event.scope() + "|" + event.id();
      byte[] expiry = seen.get(idKey); // epoch milliseconds, decimal
      if (expiry != null
          && Long.parseLong(new String(expiry, StandardCharsets.US_ASCII)) > now * 1000) {
        progress.duplicates.incrementAndGet();
        return;
      }
      long expires = (long) ((now + ttl) * 1000);
      seen.put(idKey, Long.toString(expires).getBytes(StandardCharsets.US_ASCII));

      String markKey = event.scope() + "|" + event.bucket() + "/" + event.key();
      double latest = now + MAX_CLOCK_SKEW_S;
      String[] last = readMark(marks.get(markKey), latest);
      String reason = staleReason(event, last);
      Headers headers = new RecordHeaders();
      headers.add("ce_id", event.id().getBytes(StandardCharsets.UTF_8));
      if (reason != null) {
        headers.add("stale.reason", reason.getBytes(StandardCharsets.UTF_8));
        context.forward(new Record<>(record.key(), record.value(), record.timestamp(), headers));
        progress.stale.incrementAndGet();
        return;
      }
      if (!(event.type().equals("deleted") && event.versionOnly())) {
        String time = event.time() == null ? "" : Double.toString(event.time());
        if (event.time() != null && event.time() > latest) {
          time = last == null ? "" : last[2]; // a time beyond the skew bound is not recorded
        }
        String mark =
            (event.kind() == null ? "" : event.kind())
                + "\t"
                + (event.token() == null ? "" : event.token())
                + "\t"
                + time
                + "\t"
                + event.id()
                + "\t"
                + event.type();
        marks.put(markKey, mark.getBytes(StandardCharsets.UTF_8));
      }
      context.forward(new Record<>(record.key(), record.value(), record.timestamp(), headers));
      progress.emitted.incrementAndGet();
    }

    /** kind, token, time, id, type; a time beyond `latest` is forgotten (bounded_mark). */
    static String[] readMark(byte[] stored, double latest) {
      if (stored == null) {
        return null;
      }
      String[] mark = new String(stored, StandardCharsets.UTF_8).split("\t", -1);
      if (!mark[2].isEmpty() && Double.parseDouble(mark[2]) > latest) {
        mark[2] = "";
      }
      return mark;
    }

    static String staleReason(Event event, String[] last) {
      if (last == null) {
        return null;
      }
      if (event.kind() != null
          && event.kind().equals(last[0])
          && event.token() != null
          && !last[1].isEmpty()) {
        return event.token().compareTo(last[1]) < 0
            ? event.kind()
                + " "
                + event.sequencer()
                + " is older than that of the emitted "
                + last[4]
                + " event "
                + last[3]
            : null;
      }
      if (event.time() != null && !last[2].isEmpty() && event.time() < Double.parseDouble(last[2])) {
        return "event time is older than that of the emitted " + last[4] + " event " + last[3];
      }
      return null;
    }
  }

  // ------------------------------------------------------------------------------ running

  static KafkaStreams streams(Map<String, String> args, String suffix, Progress progress) {
    String stale = args.get("stale") + suffix;
    String output = args.get("output") + suffix;
    int partitions = Integer.parseInt(args.getOrDefault("partitions", "4"));
    double ttl = Double.parseDouble(args.getOrDefault("ttl", "86400"));
    StreamsBuilder builder = new StreamsBuilder();
    for (String store : List.of("seen", "marks")) {
      builder.addStateStore(
          Stores.keyValueStoreBuilder(
                  Stores.persistentKeyValueStore(store), Serdes.String(), Serdes.ByteArray())
              .withLoggingEnabled(Map.of()));
    }
    builder.stream(args.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
        .process(() -> new Parse(progress))
        .repartition(
            Repartitioned.with(Serdes.ByteArray(), Serdes.ByteArray())
                .withName("by-key")
                .withNumberOfPartitions(partitions))
        .process(() -> new Decide(progress, ttl), "seen", "marks")
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
      throws java.io.IOException, InterruptedException {
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
          "done %d deliveries=%d events=%d emitted=%d stale=%d duplicates=%d malformed=%d%n",
          done,
          progress.deliveries.get(),
          progress.events.get(),
          progress.emitted.get(),
          progress.stale.get(),
          progress.duplicates.get(),
          progress.malformed.get());
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
    for (String required : List.of("bootstrap", "input", "app", "output", "stale", "deliveries", "state")) {
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
