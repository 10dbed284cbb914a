package relay

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
)

// DefaultMaxMessageBytes is the default Config.MaxMessageBytes: 1 MiB less
// room for the record's framing, so that an event within it fits the
// default max.message.bytes (1048588) of Kafka and the embedded broker.
const DefaultMaxMessageBytes = 1<<20 - 512

// The defaults of WithDefaults, written once: `relay run`'s flags
// (internal/cli) take theirs from here.
const (
	DefaultBatchSize       = 1000
	DefaultBatchBytes      = 8 << 20
	DefaultAckInterval     = 10 * time.Millisecond
	DefaultShutdownTimeout = 30 * time.Second
	DefaultLease           = 3 * time.Second
	DefaultBacklogInterval = 5 * time.Second
	DefaultPruneInterval   = time.Minute
	DefaultPruneBatch      = 10_000
	DefaultReplayInterval  = time.Second
	DefaultReadyTimeout    = 30 * time.Second
)

// Config configures a Relay. Zero fields take the defaults of WithDefaults.
type Config struct {
	// DatabaseURL is the connection string; empty means the PG* variables.
	DatabaseURL string
	// Schema holds the outbox and Relay's tables (default "outbox").
	Schema string
	// Name keys the checkpoint row (default "default").
	Name string
	// SourceKind names the reader ("poll" or "cdc"); a checkpoint written
	// by another kind of reader has a position this one cannot use.
	SourceKind string
	// BatchSize is how many events are read and published at once
	// (default 1000); a backlog spread thin over many topics is read in
	// pages of up to 8 times as many (pagesize.go).
	BatchSize int
	// BatchBytes bounds a batch's bytes of events (default 8 MiB; budget.go).
	BatchBytes int
	// MaxMessageBytes bounds key, payload and headers (the relay's own
	// included) of one event; larger events go to the dead letters
	// (default 1 MiB - 512: such an event, framed as a record batch, fits
	// the default max.message.bytes, 1 MiB + 12, of Kafka and the embedded
	// broker).
	MaxMessageBytes int
	// AckInterval is the shortest time between two acknowledgement
	// transactions (default 10ms); batches made durable meanwhile are
	// acknowledged together. Publication does not wait for it: it bounds
	// how many Postgres transactions (and WAL flushes) the relay costs per
	// second, at the price of published rows staying in the outbox that
	// much longer, and a crash re-delivering them (the embedded sink skips
	// what its log holds). While a backlog is read it is 10 times as long
	// (ack.go). Negative disables it.
	AckInterval time.Duration
	// ShutdownTimeout bounds how long a graceful stop may take to finish
	// the in-flight batch before work is abandoned (default 30s).
	ShutdownTimeout time.Duration
	// Lease is how long a leader's renewal of its leadership counts (default
	// 3s). A standby takes over after seeing no renewal for a whole lease;
	// the leader stops appending and acknowledging a fifth of a lease
	// before that (see leadership.go).
	Lease time.Duration
	// BacklogInterval is how often the backlog gauge is sampled (default
	// 5s).
	BacklogInterval time.Duration
	// Retain keeps published events in the archive table for this long, for
	// replay; 0 deletes them when they are acknowledged.
	Retain time.Duration
	// PruneInterval is how often archived events older than Retain are
	// deleted (default 1m), PruneBatch how many per statement (default
	// 10000).
	PruneInterval time.Duration
	PruneBatch    int
	// ReplayInterval is how often the leader looks for replay requests
	// while none runs (default 1s).
	ReplayInterval time.Duration
	// DeadLetterPolicy is what a dead letter does to its key's later
	// events: PolicySkip (default) publishes them, PolicyHoldKey holds
	// them until it is retried or discarded (hold.go). TopicPolicies
	// overrides it per topic.
	DeadLetterPolicy string
	TopicPolicies    map[string]string
	// ReadyTimeout is how long the leader stays ready without a heartbeat
	// that went through the whole path (default 30s; heartbeat.go).
	// Negative sends no heartbeat: for sources that do not read the outbox
	// table.
	ReadyTimeout time.Duration
	// Validator, when set, checks payloads against their topic's schema
	// contract before publication; an event that breaks it goes to the
	// dead letters (route.go).
	Validator Validator
	// Tracer, when set, traces each publication (trace.go); nil is
	// tracing off, at no cost.
	Tracer trace.Tracer
	// CloudEvents presents events as CloudEvents (cloudevents.go); off
	// by default.
	CloudEvents CloudEvents
	Logger      *slog.Logger
	Metrics     *Metrics
}

// WithDefaults returns c with unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.Name == "" {
		c.Name = "default"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BatchBytes <= 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.AckInterval == 0 {
		c.AckInterval = DefaultAckInterval
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.BacklogInterval <= 0 {
		c.BacklogInterval = DefaultBacklogInterval
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = DefaultPruneInterval
	}
	if c.PruneBatch <= 0 {
		c.PruneBatch = DefaultPruneBatch
	}
	if c.ReplayInterval <= 0 {
		c.ReplayInterval = DefaultReplayInterval
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.DeadLetterPolicy == "" {
		c.DeadLetterPolicy = PolicySkip
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	return c
}

// Validate checks c after defaults.
func (c Config) Validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	if c.Retain < 0 {
		return fmt.Errorf("retention %v is negative", c.Retain)
	}
	if c.Lease < 100*time.Millisecond {
		return fmt.Errorf("lease %v is below the minimum of 100ms", c.Lease)
	}
	if c.BatchSize > 100_000 {
		return fmt.Errorf("batch size %d is above the limit of 100000", c.BatchSize)
	}
	if err := c.validatePolicies(); err != nil {
		return err
	}
	if err := c.CloudEvents.validate(); err != nil {
		return err
	}
	_, err := pgconfig.ParseConfig(c.DatabaseURL)
	return err
}
