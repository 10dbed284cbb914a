package relay

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the relay's Prometheus metrics. Every name starts with
// "relay_".
type Metrics struct {
	Registry *prometheus.Registry

	Published     *prometheus.CounterVec
	Latency       prometheus.Histogram
	ReadLatency   prometheus.Histogram
	LatencyMax    prometheus.Gauge
	CommitLatency prometheus.Histogram
	CommitMax     prometheus.Gauge
	// Dwell is each topic's outbox dwell time, with the event's trace id
	// as exemplar while tracing (trace.go).
	Dwell         *prometheus.HistogramVec
	BatchSize     prometheus.Histogram
	Backlog       prometheus.Gauge
	DeadLetters   *prometheus.CounterVec
	Errors        *prometheus.CounterVec
	Leader        prometheus.Gauge
	LastPublished prometheus.Gauge
	PublishRate   prometheus.Gauge
	DrainETA      prometheus.Gauge
	ArchivePruned prometheus.Counter
	Replayed      prometheus.Counter
	HeldKeys      prometheus.Gauge
	HeldEvents    prometheus.Gauge
	HeartbeatAge  prometheus.GaugeFunc
	// heartbeatAge computes HeartbeatAge at each scrape (set by New).
	heartbeatAge atomic.Pointer[func() float64]
	// DestinationWaiting has a sample per topic whose events wait because
	// the destination refuses it for now (see DestinationError).
	DestinationWaiting *prometheus.GaugeVec
	// MaintenanceErrors and MaintenanceOK are the maintenance services'
	// failed passes and last good one (maintenance.go).
	MaintenanceErrors *prometheus.CounterVec
	MaintenanceOK     *prometheus.GaugeVec
}

// NewMetrics registers the relay's metrics, with the Go and process
// collectors, in a new registry.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every metric is made and registered by one of these, from its name
	// and help (and buckets or labels); promauto panics on a duplicate
	// name as MustRegister does.
	f := promauto.With(reg)
	gauge := func(name, help string) prometheus.Gauge {
		return f.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return f.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return f.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	// About 26% apart from 0.1 ms to 100 s: fine enough for percentiles
	// read off the buckets.
	latencyBuckets := prometheus.ExponentialBucketsRange(0.0001, 100, 60)

	m := &Metrics{Registry: reg}
	m.Published = counterVec("relay_events_published_total", "Outbox events durably published, by topic.", "topic")
	m.Latency = histogram("relay_publish_latency_seconds", "Time from an event's created_at (its INSERT, in its transaction) to the sink's durable acknowledgement.", latencyBuckets)
	m.ReadLatency = histogram("relay_read_latency_seconds", "Time from an event's created_at (its INSERT, in its transaction) to the reader handing it to the pipeline; the rest of relay_publish_latency_seconds is the sink's.", latencyBuckets)
	m.LatencyMax = gauge("relay_publish_latency_max_seconds", "Largest publish latency observed since the process started.")
	m.CommitLatency = histogram("relay_commit_latency_seconds", "Time from the commit of an event's transaction to the sink's durable acknowledgement, for readers that know commit times (cdc).", latencyBuckets)
	m.CommitMax = gauge("relay_commit_latency_max_seconds", "Largest commit latency observed since the process started.")
	m.Dwell = f.NewHistogramVec(prometheus.HistogramOpts{
		Name: "relay_dwell_seconds",
		Help: "Time an event spent in the outbox, by topic: from its transaction's commit (cdc reader) or its created_at (poll reader) to the sink's durable acknowledgement. While tracing, exemplars carry the event's trace id (OpenMetrics).",
		// About 78% apart from 1 ms to 100 s: the per-topic view; the
		// instance-wide latency histograms above are the finer ones.
		Buckets: prometheus.ExponentialBucketsRange(0.001, 100, 21),
	}, []string{"topic"})
	m.BatchSize = histogram("relay_batch_size_events", "Events per batch handed to the sink.", prometheus.ExponentialBuckets(1, 2, 15))
	m.Backlog = gauge("relay_backlog_rows", "Rows in the outbox table not yet acknowledged (sampled).")
	m.DeadLetters = counterVec("relay_dead_letters_total", "Events moved to the dead-letter table, by reason.", "reason")
	m.Errors = counterVec("relay_errors_total", "Pipeline failures that caused a restart, by stage (source, sink, ack, leader, schema, release, replay).", "stage")
	m.Leader = gauge("relay_leader", "1 while this process holds the outbox's leader lease, else 0.")
	m.LastPublished = gauge("relay_last_publish_timestamp_seconds", "Unix time of the last durable acknowledgement.")
	m.PublishRate = gauge("relay_publish_rate_events_per_second", "Recent rate of acknowledged live events (smoothed over about a minute of backlog samples).")
	m.DrainETA = gauge("relay_backlog_drain_seconds", "Estimated time to drain the backlog at the recent publish rate: 0 when empty, -1 when nothing is being published.")
	m.ArchivePruned = counter("relay_archive_pruned_total", "Archived events deleted because they were older than the retention (--retain).")
	m.Replayed = counter("relay_replayed_events_total", "Archived events republished by replay requests.")
	m.HeldKeys = gauge("relay_held_keys", "Keys held behind a dead letter (dead-letter policy hold-key), sampled on the leader.")
	m.HeldEvents = gauge("relay_held_events", "Events held behind their key's dead letter, waiting for its retry or discard, sampled on the leader.")
	m.HeartbeatAge = f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_heartbeat_age_seconds",
		Help: "On the leader: how long ago the newest heartbeat that went through reader, sink and acknowledgement was sent (/readyz fails above --ready-timeout); 0 elsewhere.",
	}, func() float64 {
		if f := m.heartbeatAge.Load(); f != nil {
			return (*f)()
		}
		return 0
	})
	m.DestinationWaiting = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relay_destination_waiting_since_timestamp_seconds",
		Help: "Unix time since when the destination refuses a topic for now (missing, unauthorized, throttled), by topic and reason; its events wait in the outbox. No sample while nothing waits.",
	}, []string{"topic", "reason"})
	m.MaintenanceErrors = f.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_maintenance_errors_total",
		Help: "Failed passes of the leader's maintenance services (backlog, holds, heartbeat, prune), by service and kind (timeout, sqlstate_<code>, connection); a failing service's gauges are stale.",
	}, []string{"service", "kind"})
	m.MaintenanceOK = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relay_maintenance_last_success_timestamp_seconds",
		Help: "Unix time of the last good pass of each of the leader's maintenance services (backlog, holds, heartbeat, prune).",
	}, []string{"service"})
	return m
}
