package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Config configures the Kafka sink. Zero fields take the defaults of
// WithDefaults.
type Config struct {
	// Brokers are the seed brokers, host:port; required.
	Brokers []string
	// ClientID names the relay in the brokers' logs and quotas (default
	// "relay").
	ClientID string
	TLS      TLSConfig
	SASL     SASLConfig
	// Compression of produced batches: "lz4" (default), "zstd", "snappy",
	// "gzip" or "none".
	Compression string
	// Linger is how long a partition's batch waits for more records before
	// it is sent (default 0: as soon as the client has a free request
	// slot, five per broker; behind busy slots records gather into larger
	// batches by themselves). The core hands the sink whole batches, so a
	// linger mostly adds its own length to every event's latency.
	Linger time.Duration
	// BatchMaxBytes caps one produce batch before compression. Zero means
	// each topic's max.message.bytes, or Kafka's default of 1048588 bytes
	// when the cluster does not report it. A set value is still lowered to
	// a topic's max.message.bytes.
	BatchMaxBytes int32
	// CreateTopics creates a topic the first time an event names it and
	// the cluster does not have it, with Partitions and ReplicationFactor.
	// Without it an event for a missing topic is refused (dead-lettered)
	// with an error naming the topic.
	CreateTopics bool
	// Partitions of created topics; -1 (the default) is the cluster's
	// num.partitions.
	Partitions int32
	// ReplicationFactor of created topics; -1 (the default) is the
	// cluster's default.replication.factor.
	ReplicationFactor int16
	// TransactionalID turns on exactly-once mode: each Publish is one Kafka
	// transaction that also records the relay's progress in ProgressTopic.
	// It must be unique per outbox and stable across restarts (see the
	// package documentation).
	TransactionalID string
	// ProgressTopic holds the exactly-once mode's progress markers (default
	// "relay-progress"). The sink creates it when missing (one partition,
	// ReplicationFactor, seven days' retention), whatever CreateTopics says.
	ProgressTopic string
	// PublishTimeout bounds one Publish: when the cluster has not
	// acknowledged every record by then, Publish returns an error and the
	// core retries later (default 30s).
	PublishTimeout time.Duration
	// DialTimeout bounds connecting to a broker (default 10s).
	DialTimeout time.Duration
	// Logger receives the sink's logs and the client's warnings (default
	// slog.Default()).
	Logger *slog.Logger
}

// TLSConfig configures TLS to the brokers.
type TLSConfig struct {
	// Enable turns TLS on; it is implied by any other field.
	Enable bool
	// CAFile is a PEM bundle of the CAs to trust instead of the system's.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// mutual TLS; set both or neither.
	CertFile string
	KeyFile  string
	// InsecureSkipVerify accepts any server certificate. Unsafe: for tests
	// only.
	InsecureSkipVerify bool
}

func (c TLSConfig) enabled() bool {
	return c.Enable || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.InsecureSkipVerify
}

// SASL mechanisms.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASLConfig configures SASL authentication. The password never appears in
// logs or errors: SASLConfig logs itself without it.
type SASLConfig struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty means no
	// SASL.
	Mechanism string
	User      string
	Password  string
}

// LogValue keeps the password out of structured logs.
func (c SASLConfig) LogValue() slog.Value {
	return slog.GroupValue(slog.String("mechanism", c.Mechanism), slog.String("user", c.User))
}

// String keeps the password out of formatted output.
func (c SASLConfig) String() string {
	return fmt.Sprintf("{mechanism:%s user:%s}", c.Mechanism, c.User)
}

// Defaults of Config.
const (
	DefaultClientID       = "relay"
	DefaultCompression    = "lz4"
	DefaultLinger         = 0
	DefaultProgressTopic  = "relay-progress"
	DefaultPublishTimeout = 30 * time.Second
	DefaultDialTimeout    = 10 * time.Second
	// DefaultMaxMessageBytes is Kafka's default max.message.bytes, used
	// when a topic's own is unknown.
	DefaultMaxMessageBytes = 1048588
)

// WithDefaults returns c with unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.Compression == "" {
		c.Compression = DefaultCompression
	}
	c.Compression = strings.ToLower(c.Compression)
	if c.Partitions == 0 {
		c.Partitions = -1
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = -1
	}
	if c.ProgressTopic == "" {
		c.ProgressTopic = DefaultProgressTopic
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.SASL.Mechanism = strings.ToUpper(c.SASL.Mechanism)
	return c
}

// Validate checks c after defaults.
func (c Config) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka sink: at least one broker address is required")
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("kafka sink: broker address %q: %w", b, err)
		}
	}
	if _, err := compressionCodec(c.Compression); err != nil {
		return err
	}
	if c.Linger < 0 {
		return fmt.Errorf("kafka sink: negative linger %v", c.Linger)
	}
	if c.BatchMaxBytes != 0 && (c.BatchMaxBytes < 512 || c.BatchMaxBytes > 1<<30) {
		return fmt.Errorf("kafka sink: batch max bytes %d is outside 512..%d", c.BatchMaxBytes, 1<<30)
	}
	if c.Partitions < -1 {
		return fmt.Errorf("kafka sink: partitions %d: use a positive count, or -1 for the cluster's default", c.Partitions)
	}
	if c.ReplicationFactor < -1 {
		return fmt.Errorf("kafka sink: replication factor %d: use a positive count, or -1 for the cluster's default", c.ReplicationFactor)
	}
	if err := validTopic(c.ProgressTopic); err != nil {
		return fmt.Errorf("kafka sink: progress topic: %w", err)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return errors.New("kafka sink: a TLS client certificate needs both a certificate file and a key file")
	}
	switch c.SASL.Mechanism {
	case "":
		if c.SASL.User != "" || c.SASL.Password != "" {
			return errors.New("kafka sink: a SASL user or password is set but no SASL mechanism")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASL.User == "" {
			return fmt.Errorf("kafka sink: SASL %s needs a user", c.SASL.Mechanism)
		}
	default:
		return fmt.Errorf("kafka sink: unknown SASL mechanism %q (want %s, %s or %s)",
			c.SASL.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	return nil
}

func compressionCodec(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("kafka sink: unknown compression %q (want none, gzip, snappy, lz4 or zstd)", name)
}

func (c Config) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.TLS.InsecureSkipVerify}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka sink: reading the TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka sink: %s holds no PEM certificate", c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka sink: loading the TLS client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func (c Config) saslMechanism() sasl.Mechanism {
	switch c.SASL.Mechanism {
	case SASLPlain:
		return plain.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsMechanism()
	case SASLScramSHA256:
		return scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		return scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha512Mechanism()
	}
	return nil
}

// ClientOpts are the options every client of the sink shares
// (connection, security, logging), for tools that talk to the same
// cluster without producing (relay doctor).
func (c Config) ClientOpts() ([]kgo.Opt, error) { return c.clientOpts() }

// clientOpts are the options every client of the sink shares: connection,
// security and logging.
func (c Config) clientOpts() ([]kgo.Opt, error) {
	return c.clientOptsDialing(nil)
}

// clientOptsDialing is clientOpts with the connections dialled through d
// (TLS included) when d is set.
func (c Config) clientOptsDialing(d *fencedDialer) ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		kgo.WithLogger(kgoLogger{c.Logger}),
		kgo.DialTimeout(c.DialTimeout),
		// Metadata and admin requests give up in bounded time, so Start,
		// Ready and topic checks fail instead of hanging in an outage.
		kgo.RequestRetries(3),
		kgo.RetryTimeout(c.DialTimeout),
	}
	if d != nil {
		opts = append(opts, kgo.Dialer(d.dial))
	} else if c.TLS.enabled() {
		tc, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if m := c.saslMechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// kgoLogger passes the client's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelInfo
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	case kgo.LogLevelDebug:
		l = slog.LevelDebug
	}
	k.l.Log(context.Background(), l, "kafka client: "+msg, keyvals...)
}
