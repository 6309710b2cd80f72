// Users and ACLs for the secured local broker, through Kafka's Admin API: the broker jars that
// localkafka.py fetches have neither kafka-acls.sh nor kafka-configs.sh (they live in the
// kafka-tools artifact), so this one file, run in Java's source-file mode, does what the tests
// and `localkafka.py admin` need of them.
//
//   java -cp '<libs>/*' LocalAdmin.java <client.properties>   < commands
//
// One command per line, its words separated by tabs (localkafka.py splits shell words):
//   scram <user> <password>                    create or update a SCRAM-SHA-512 user
//   kafka-acls.sh [--bootstrap-server X] [--command-config F] --add
//       --allow-principal User:<name> --operation <Op> [--operation <Op> ...]
//       (--topic T | --group G | --transactional-id T | --cluster)
//       [--resource-pattern-type literal|prefixed] [--allow-host H]
//                                              the subset of kafka-acls.sh that
//                                              `python -m streams acls` prints
//   feature <name> <level>                     set a finalized feature (kafka-features.sh
//                                              upgrade/downgrade; 0 removes it), as an
//                                              operator's cluster may have it
// Lines starting with # and empty lines are skipped. Prints one line per change.

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class LocalAdmin {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: LocalAdmin <client.properties> < commands");
            System.exit(2);
        }
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        List<AclBinding> acls = new ArrayList<>();
        List<UserScramCredentialUpsertion> users = new ArrayList<>();
        Map<String, Short> features = new LinkedHashMap<>();
        BufferedReader reader =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = reader.readLine()) != null) {
            if (line.isBlank() || line.startsWith("#")) {
                continue;
            }
            String[] words = line.split("\t");
            if (words[0].equals("scram") && words.length == 3) {
                users.add(new UserScramCredentialUpsertion(
                        words[1],
                        new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                        words[2]));
            } else if (words[0].equals("feature") && words.length == 3) {
                features.put(words[1], Short.parseShort(words[2]));
            } else if (words[0].endsWith("kafka-acls.sh") || words[0].endsWith("kafka-acls")) {
                acls.addAll(parseAcl(words));
            } else {
                throw new IllegalArgumentException("not a command: " + words[0]);
            }
        }
        try (Admin admin = Admin.create(props)) {
            if (!features.isEmpty()) {
                Map<String, FeatureUpdate> updates = new LinkedHashMap<>();
                Map<String, Short> finalized = new LinkedHashMap<>();
                admin.describeFeatures().featureMetadata().get().finalizedFeatures()
                        .forEach((name, range) -> finalized.put(name, range.maxVersionLevel()));
                for (Map.Entry<String, Short> feature : features.entrySet()) {
                    short now = finalized.getOrDefault(feature.getKey(), (short) 0);
                    FeatureUpdate.UpgradeType type = feature.getValue() >= now
                            ? FeatureUpdate.UpgradeType.UPGRADE
                            : FeatureUpdate.UpgradeType.UNSAFE_DOWNGRADE;
                    updates.put(feature.getKey(), new FeatureUpdate(feature.getValue(), type));
                }
                admin.updateFeatures(updates, new UpdateFeaturesOptions()).all().get();
                for (Map.Entry<String, Short> feature : features.entrySet()) {
                    System.out.println("feature " + feature.getKey() + "=" + feature.getValue());
                }
            }
            if (!users.isEmpty()) {
                admin.alterUserScramCredentials(new ArrayList<>(users)).all().get();
                for (UserScramCredentialUpsertion user : users) {
                    System.out.println("user " + user.user() + " (SCRAM-SHA-512)");
                }
            }
            if (!acls.isEmpty()) {
                admin.createAcls(acls).all().get();
                for (AclBinding acl : acls) {
                    System.out.println("acl " + acl);
                }
            }
        }
    }

    /** kafka-acls.sh's operation names (Read, IdempotentWrite, DescribeConfigs, ...). */
    static AclOperation operation(String name) {
        String constant = name.replaceAll("([a-z])([A-Z])", "$1_$2").toUpperCase(Locale.ROOT);
        AclOperation operation = AclOperation.fromString(constant);
        if (operation == AclOperation.UNKNOWN || operation == AclOperation.ANY) {
            throw new IllegalArgumentException("unknown operation: " + name);
        }
        return operation;
    }

    static List<AclBinding> parseAcl(String[] words) {
        List<String> principals = new ArrayList<>();
        List<AclOperation> operations = new ArrayList<>();
        List<ResourcePattern> resources = new ArrayList<>();
        PatternType patternType = PatternType.LITERAL;
        String host = "*";
        boolean add = false;
        List<String[]> named = new ArrayList<>();
        for (int i = 1; i < words.length; i++) {
            String word = words[i];
            switch (word) {
                case "--add" -> add = true;
                case "--cluster" -> named.add(new String[] {"cluster", "kafka-cluster"});
                case "--bootstrap-server", "--command-config" -> i++;
                default -> {
                    if (i + 1 >= words.length) {
                        throw new IllegalArgumentException(word + " takes a value");
                    }
                    String value = words[++i];
                    switch (word) {
                        case "--allow-principal" -> principals.add(value);
                        case "--allow-host" -> host = value;
                        case "--operation" -> operations.add(operation(value));
                        case "--topic" -> named.add(new String[] {"topic", value});
                        case "--group" -> named.add(new String[] {"group", value});
                        case "--transactional-id" ->
                                named.add(new String[] {"transactional-id", value});
                        case "--resource-pattern-type" ->
                                patternType = PatternType.fromString(value.toUpperCase(Locale.ROOT));
                        default -> throw new IllegalArgumentException("unsupported: " + word);
                    }
                }
            }
        }
        if (!add || principals.isEmpty() || operations.isEmpty() || named.isEmpty()) {
            throw new IllegalArgumentException(
                    "needs --add, --allow-principal, --operation and a resource: "
                            + String.join(" ", words));
        }
        for (String[] item : named) {
            ResourceType type = switch (item[0]) {
                case "topic" -> ResourceType.TOPIC;
                case "group" -> ResourceType.GROUP;
                case "transactional-id" -> ResourceType.TRANSACTIONAL_ID;
                default -> ResourceType.CLUSTER;
            };
            PatternType pattern = type == ResourceType.CLUSTER ? PatternType.LITERAL : patternType;
            resources.add(new ResourcePattern(type, item[1], pattern));
        }
        List<AclBinding> bindings = new ArrayList<>();
        for (ResourcePattern resource : resources) {
            for (String principal : principals) {
                for (AclOperation operation : operations) {
                    bindings.add(new AclBinding(resource, new AccessControlEntry(
                            principal, host, operation, AclPermissionType.ALLOW)));
                }
            }
        }
        return bindings;
    }
}
