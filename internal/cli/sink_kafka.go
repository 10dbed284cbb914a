package cli

import (
	"flag"
	"log/slog"
	"math"
	"strings"

	"github.com/outboxrelay/relay/internal/sink/kafka"
)

// kafkaSinkFlags are `relay run`'s flags for --sink kafka.
type kafkaSinkFlags struct {
	brokers       string
	cfg           kafka.Config
	batchMaxBytes int
	partitions    int
	replication   int
}

func (k *kafkaSinkFlags) register(fs *flag.FlagSet) {
	c := &k.cfg
	fs.StringVar(&k.brokers, "kafka-brokers", "", "Kafka sink: seed brokers, host:port[,host:port]")
	fs.StringVar(&c.ClientID, "kafka-client-id", "relay", "Kafka sink: client id")
	fs.BoolVar(&c.TLS.Enable, "kafka-tls", false, "Kafka sink: connect with TLS (implied by the other TLS flags)")
	fs.StringVar(&c.TLS.CAFile, "kafka-tls-ca-file", "", "Kafka sink: PEM CAs to trust instead of the system's")
	fs.StringVar(&c.TLS.CertFile, "kafka-tls-cert-file", "", "Kafka sink: PEM client certificate (mutual TLS)")
	fs.StringVar(&c.TLS.KeyFile, "kafka-tls-key-file", "", "Kafka sink: PEM client key (mutual TLS)")
	fs.BoolVar(&c.TLS.InsecureSkipVerify, "kafka-tls-insecure-skip-verify", false, "Kafka sink: accept any server certificate (unsafe, tests only)")
	fs.StringVar(&c.SASL.Mechanism, "kafka-sasl-mechanism", "", "Kafka sink: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	fs.StringVar(&c.SASL.User, "kafka-sasl-user", "", "Kafka sink: SASL user")
	fs.StringVar(&c.SASL.Password, "kafka-sasl-password", "", "Kafka sink: SASL password (prefer RELAY_KAFKA_SASL_PASSWORD)")
	fs.StringVar(&c.Compression, "kafka-compression", kafka.DefaultCompression, "Kafka sink: lz4, zstd, snappy, gzip or none")
	fs.DurationVar(&c.Linger, "kafka-linger", kafka.DefaultLinger, "Kafka sink: how long a partition's batch waits for more records (0: sent as soon as a request slot is free)")
	fs.IntVar(&k.batchMaxBytes, "kafka-batch-max-bytes", 0, "Kafka sink: produce batch cap (0: each topic's max.message.bytes)")
	fs.BoolVar(&c.CreateTopics, "kafka-create-topics", false, "Kafka sink: create missing topics (otherwise their events wait in the outbox until the topic exists)")
	fs.IntVar(&k.partitions, "kafka-topic-partitions", -1, "Kafka sink: partitions of created topics (-1: the cluster's default)")
	fs.IntVar(&k.replication, "kafka-topic-replication-factor", -1, "Kafka sink: replication factor of created topics (-1: the cluster's default)")
	fs.StringVar(&c.TransactionalID, "kafka-transactional-id", "", "Kafka sink: exactly-once mode with this transactional id (unique per outbox)")
	fs.StringVar(&c.ProgressTopic, "kafka-progress-topic", kafka.DefaultProgressTopic, "Kafka sink: topic of the exactly-once progress markers")
	fs.DurationVar(&c.PublishTimeout, "kafka-publish-timeout", kafka.DefaultPublishTimeout, "Kafka sink: how long a batch may wait for acknowledgements")
	fs.DurationVar(&c.DialTimeout, "kafka-dial-timeout", kafka.DefaultDialTimeout, "Kafka sink: broker connection timeout")
}

// config returns the sink's configuration, validated.
func (k *kafkaSinkFlags) config(log *slog.Logger) (kafka.Config, error) {
	c := k.cfg
	for _, b := range strings.Split(k.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.Brokers = append(c.Brokers, b)
		}
	}
	if len(c.Brokers) == 0 {
		return c, usagef("--sink kafka needs --kafka-brokers")
	}
	// The flags are ints; each is checked against its field's range
	// before the conversion, which would otherwise wrap a large value
	// into a different one that might pass the sink's own checks.
	switch {
	case k.batchMaxBytes < math.MinInt32 || k.batchMaxBytes > math.MaxInt32:
		return c, usagef("--kafka-batch-max-bytes %d: must be 0 or 512..%d", k.batchMaxBytes, 1<<30)
	case k.partitions < math.MinInt32 || k.partitions > math.MaxInt32:
		return c, usagef("--kafka-topic-partitions %d: out of range", k.partitions)
	case k.replication < math.MinInt16 || k.replication > math.MaxInt16:
		return c, usagef("--kafka-topic-replication-factor %d: out of range", k.replication)
	}
	c.BatchMaxBytes = int32(k.batchMaxBytes)
	c.Partitions = int32(k.partitions)
	c.ReplicationFactor = int16(k.replication)
	c.Logger = log
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return c, usagef("%v", err)
	}
	return c, nil
}
