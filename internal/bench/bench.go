// Package bench is `relay-dev bench`: it measures the real relay, a child
// process running `relay run` (relay-dev's own), end to end against
// PostgreSQL, and in the same run the baseline a reader cannot beat: for the polling reader, plain
// SQL that reads and deletes the same rows in batches (DELETE ...
// RETURNING); for the WAL reader, pg_recvlogical decoding the same WAL range
// with pgoutput, with the relay's options (binary values from PostgreSQL 14
// on), to /dev/null.
//
// Two modes:
//   - backlog: every event is written first, then the relay starts and
//     drains them (the replay-after-outage case); the figure is events/s
//     from the relay's start to the last durable acknowledgement.
//   - live: writers insert while the relay runs, open loop at --rate events
//     per second or as fast as they can (closed loop); the figures are the
//     write and publish rates and the latency percentiles to the durable
//     acknowledgement (fsync), read from the relay's own histograms: from
//     each transaction's commit (its commit record's time) with the WAL
//     reader, from created_at (the INSERT, before the commit, so a longer
//     span) with the polling reader, which cannot know commit times. With
//     --long-tx a transaction that wrote in another database of the
//     cluster stays open for the whole run (mode "live+long-tx"): the
//     latencies are those during it.
//
// With --sink kafka the relay publishes into the cluster its --relay-args
// name, or, without --kafka-brokers, into an in-memory Kafka-protocol
// cluster the bench runs in its own process (franz-go's kfake). A live
// run into Kafka also measures the latency to arrival in the cluster: a
// consumer in the bench reads the bench topic from its end as the writers
// start and notes when each event arrived, from its transaction's commit
// (cdc, when PostgreSQL keeps commit timestamps: the throwaway server
// does) or its created_at (poll). RelayBinary may be another build, so
// that one bench compares two relays.
//
// Scale shapes: Topics spreads the events over topics bench-0 ..
// bench-N-1 (by event number), the key following the event number divided
// by the topics, so that a topic's events spread over its keys and
// partitions; Partitions is the relay's --partitions,
// Keys goes up to 10,000,000 (keys are computed in the INSERT, so
// nothing in the bench grows with them), PayloadMix draws payload sizes
// log-uniformly from 100 B to 1,000,000 B, and Consumers reads a drained
// backlog back through the relay's Kafka listener (one consumer, or a
// group). RunBroker (`relay-dev bench broker`) measures the embedded
// broker alone: the open time of a data directory after a clean stop or
// a SIGKILL, warm or cold, and a compaction pass (broker.go). RunBigTx
// (`relay-dev bench bigtx`) publishes one large transaction with the WAL
// reader, pgoutput streaming on and off (bigtx.go).
//
// The relay's peak RSS, CPU seconds (and CPU per published event) and
// open file descriptors come from /proc. After a backlog drain, IdleRSS
// keeps the relay idle (the read-back consumers still connected) and
// reads its resident set, and Restarts times starts over the drained data
// directory after clean stops, exec to /readyz. The first SIGINT
// stops the run and prints what was measured so far.
package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Config is one bench run.
type Config struct {
	// DatabaseURL is a server to use; empty starts a throwaway one.
	DatabaseURL string
	Source      string // poll or cdc
	Sink        string // embedded or kafka
	// CommitTimestamps runs the throwaway PostgreSQL with
	// track_commit_timestamp on, which the poll reader then orders by;
	// always on with the cdc reader (the arrival consumer measures from
	// each commit).
	CommitTimestamps bool
	Events           int
	Writers          int
	Keys             int
	PayloadBytes     int
	// Topics spreads the events over this many topics, bench-0 ..
	// bench-N-1 by event number (default 1: the topic "bench").
	Topics int
	// Partitions, when set, is passed to the relay as --partitions: the
	// partition count of the topics it creates.
	Partitions int
	// PayloadMix draws each payload's size from a log-uniform
	// distribution between 100 B and 1,000,000 B (mean about 109 KB,
	// median 10 KB) instead of PayloadBytes.
	PayloadMix bool
	// Consumers, after a backlog drain with the embedded sink, reads every
	// event back through the relay's Kafka listener: 1 is one consumer
	// assigned every partition, more is a consumer group of that many
	// members; the figure is events/s from the first fetch to the last
	// event.
	Consumers int
	// Rate is events per second across all writers (open loop); 0 writes
	// as fast as possible.
	Rate int
	// EventsPerTx is how many events each writer transaction inserts
	// (default 1 live, 1000 backlog).
	EventsPerTx int
	// Backlog writes everything before starting the relay.
	Backlog bool
	// LongTx, in a live run, holds a transaction that wrote a row in
	// another database of the cluster open from before the writers start
	// until every event is published: a batch job or an idle-in-transaction
	// session elsewhere. The latencies are then those measured during it.
	LongTx bool
	// Baseline runs the baseline after the relay (default true).
	Baseline bool
	// Schema, with Backlog, drains backlogs of JSON and Avro payloads
	// with schema validation off and on instead (schema.go).
	Schema bool
	// Tracing writes every event with a traceparent and measures each
	// run with the relay's tracing off, then on, exporting to a receiver
	// in the bench (tracing.go); no baseline.
	Tracing bool
	// RelayBinary is the relay executable to run as a child.
	RelayBinary string
	// RelayArgs are extra `relay run` flags.
	RelayArgs []string
	// Runs repeats the measurement in the same environment (default 1):
	// on a shared machine the median of a few runs says more than one.
	// Later cdc backlog runs are slower than the first: the restarted
	// reader's walsender first decodes again the WAL after the slot's
	// restart point, the previous run's deletes among it, which the
	// baseline's fresh slot never sees.
	Runs int
	// Window, in a live run, logs the latency percentiles of each such
	// interval alone, with PostgreSQL's checkpoints, autovacuums and WAL
	// volume in it (Result.Windows).
	Window time.Duration
	// IdleRSS, with Backlog, keeps the relay running this long after the
	// drain (and the read-back of Consumers) and reports its resident set
	// at the end (Result.IdleRSSBytes): the footprint of an idle relay that
	// holds the partitions and the consumer group's offsets.
	IdleRSS time.Duration
	// Restarts, with Backlog, stops the relay cleanly after the drain and
	// starts it this many times over the same data directory, timing each
	// from exec to the first 200 of /readyz (Result.ReadySeconds).
	Restarts int
	Logger   *slog.Logger
}

// positiveOr sets an unset field (zero or negative) to its default.
func positiveOr[T ~int | ~int64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Source == "" {
		c.Source = "poll"
	}
	if c.Sink == "" {
		c.Sink = "embedded"
	}
	positiveOr(&c.Events, 100_000)
	positiveOr(&c.Writers, 4)
	positiveOr(&c.Keys, 1000)
	positiveOr(&c.PayloadBytes, 200)
	positiveOr(&c.Topics, 1)
	if c.EventsPerTx <= 0 {
		c.EventsPerTx = 1
		if c.Backlog {
			c.EventsPerTx = 1000
		}
	}
	positiveOr(&c.Runs, 1)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.Source != "poll" && c.Source != "cdc":
		return fmt.Errorf("source %q: must be poll or cdc", c.Source)
	case c.Sink != "embedded" && c.Sink != "kafka":
		return fmt.Errorf("sink %q: must be embedded or kafka", c.Sink)
	case c.Rate < 0:
		return fmt.Errorf("rate must not be negative")
	case c.Backlog && c.LongTx:
		return fmt.Errorf("--long-tx applies to live runs, not --backlog")
	case c.Backlog && c.Rate > 0:
		return fmt.Errorf("--rate applies to live runs, not --backlog")
	case c.Tracing && c.Schema:
		return fmt.Errorf("--tracing does not combine with --schema-validation")
	case c.Schema && !c.Backlog:
		return fmt.Errorf("--schema-validation measures drains: it needs --backlog")
	case c.Keys > maxKeys:
		return fmt.Errorf("--keys %d: at most %d", c.Keys, maxKeys)
	case c.Topics > maxTopics:
		return fmt.Errorf("--topics %d: at most %d", c.Topics, maxTopics)
	case c.Partitions < 0 || c.Partitions > 10_000:
		return fmt.Errorf("--partitions %d: must be 1..10000 (the relay's limit)", c.Partitions)
	case c.PayloadMix && c.Schema:
		return fmt.Errorf("--payload-mix does not apply to --schema-validation (its payloads are fixed records)")
	case c.IdleRSS < 0 || c.Restarts < 0:
		return fmt.Errorf("--idle-rss and --restarts must not be negative")
	case (c.IdleRSS > 0 || c.Restarts > 0) && (!c.Backlog || c.Schema):
		return fmt.Errorf("--idle-rss and --restarts follow a drain: they need --backlog (without --schema-validation)")
	case c.Consumers < 0:
		return fmt.Errorf("--consumers must not be negative")
	case c.Consumers > 0 && (!c.Backlog || c.Sink != "embedded" || c.Schema):
		return fmt.Errorf("--consumers reads a drained backlog back from the embedded broker: it needs --backlog and --sink embedded")
	case c.RelayBinary == "":
		return fmt.Errorf("the relay binary is unknown")
	}
	return nil
}

// Result is what a run measured. Zero values mean "not measured".
type Result struct {
	Source      string        `json:"source"`
	Sink        string        `json:"sink"`
	Mode        string        `json:"mode"`
	Events      int           `json:"events"`
	Written     int           `json:"written"`
	Published   int           `json:"published"`
	WriteRate   float64       `json:"written_per_second"`
	PublishRate float64       `json:"published_per_second"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	// LatencyFrom says where latencies start: "commit" or "insert".
	LatencyFrom  string        `json:"latency_from"`
	LatencyP50   time.Duration `json:"latency_p50_ns"`
	LatencyP90   time.Duration `json:"latency_p90_ns"`
	LatencyP99   time.Duration `json:"latency_p99_ns"`
	LatencyMax   time.Duration `json:"latency_max_ns"`
	RSSPeakBytes int64         `json:"relay_rss_peak_bytes"`
	CPUSeconds   float64       `json:"relay_cpu_seconds"`
	// CPUPerEvent is the relay's CPU time (user and system) per published
	// event, in microseconds: a backlog's from the relay's start (the
	// drain's figure includes it), a live run's from the writers' start.
	CPUPerEvent float64 `json:"relay_cpu_per_event_us"`
	// IdleRSSBytes is the relay's resident set after Config.IdleRSS idle
	// past the drain (VmRSS).
	IdleRSSBytes int64 `json:"relay_idle_rss_bytes,omitempty"`
	// IdleAnonRSSBytes is the anonymous part of IdleRSSBytes (RssAnon):
	// the rest is mapped files, mostly the relay's executable.
	IdleAnonRSSBytes int64 `json:"relay_idle_anon_rss_bytes,omitempty"`
	// ReadySeconds are the Config.Restarts start-to-ready times after a
	// clean stop: exec to the first 200 of /readyz.
	ReadySeconds []float64 `json:"ready_seconds,omitempty"`
	// OpenFiles is the most file descriptors the relay held, sampled
	// from /proc/PID/fd every 100 ms of the run and at its end.
	OpenFiles int `json:"relay_open_files"`
	// PayloadBytes is the mean payload size written.
	PayloadBytes int `json:"payload_bytes"`
	Topics       int `json:"topics"`
	Partitions   int `json:"partitions,omitempty"`
	// Consume is the read-back of a drained backlog (Config.Consumers).
	Consume *ConsumeResult `json:"consume,omitempty"`
	// Arrival latencies (--sink kafka, live): from ArrivalFrom ("commit"
	// or "insert") to the bench's consumer reading the event from the
	// cluster, over the Arrived events it read.
	ArrivalFrom string        `json:"arrival_from,omitempty"`
	Arrived     int           `json:"arrived,omitempty"`
	ArrivalP50  time.Duration `json:"arrival_p50_ns,omitempty"`
	ArrivalP90  time.Duration `json:"arrival_p90_ns,omitempty"`
	ArrivalP99  time.Duration `json:"arrival_p99_ns,omitempty"`
	ArrivalMax  time.Duration `json:"arrival_max_ns,omitempty"`
	Baseline    *Baseline     `json:"baseline,omitempty"`
	// Windows are the live run's intervals (Config.Window).
	Windows []Window     `json:"windows,omitempty"`
	Schema  *SchemaBench `json:"schema_validation,omitempty"`
	// OTLPExports and OTLPBytes are the span exports (requests) the
	// bench's receiver got from the relay, with tracing on.
	OTLPExports int64 `json:"otlp_exports,omitempty"`
	OTLPBytes   int64 `json:"otlp_bytes,omitempty"`
	// Interrupted is set when SIGINT stopped the run early.
	Interrupted bool `json:"interrupted"`
}

const (
	maxKeys   = 10_000_000
	maxTopics = 10_000
)

// ConsumeResult is a drained backlog read back through the relay's Kafka
// listener.
type ConsumeResult struct {
	Consumers int   `json:"consumers"`
	Group     bool  `json:"group"`
	Records   int   `json:"records"`
	Bytes     int64 `json:"bytes"`
	// Seconds runs from the consumers' start to the last record,
	// FirstRecordSeconds to the first (metadata, the group's join).
	Seconds            float64 `json:"seconds"`
	FirstRecordSeconds float64 `json:"first_record_seconds"`
	Rate               float64 `json:"records_per_second"`
	MiBPerSec          float64 `json:"mib_per_second"`
}

// Baseline is the same work done without the relay.
type Baseline struct {
	Name  string  `json:"name"`
	Rate  float64 `json:"events_per_second"`
	Ratio float64 `json:"relay_to_baseline"`
}

// Run executes cfg.Runs bench runs in one environment, one Result each.
// When ctx ends early it returns what was measured, the last Result with
// Interrupted set.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env, err := newEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.close()
	var out []Result
	for i := 0; i < cfg.Runs; i++ {
		if i > 0 {
			cfg.Logger.Info("next run", "run", i+1, "of", cfg.Runs)
		}
		if cfg.Tracing {
			res, err := env.tracingRuns(ctx)
			out = append(out, res...)
			if err != nil || (len(res) > 0 && res[len(res)-1].Interrupted) {
				return out, err
			}
			continue
		}
		var res Result
		if cfg.Backlog && cfg.Schema {
			res, err = env.schemaBacklog(ctx)
		} else if cfg.Backlog {
			res, err = env.backlog(ctx)
		} else {
			res, err = env.live(ctx)
		}
		out = append(out, res)
		if err != nil || res.Interrupted {
			return out, err
		}
	}
	return out, nil
}
