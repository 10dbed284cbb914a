package relay

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the relay's Prometheus metrics. Every name starts with
// "relay_".
type Metrics struct {
	Registry *prometheus.Registry

	Published     *prometheus.CounterVec
	Latency       prometheus.Histogram
	LatencyMax    prometheus.Gauge
	CommitLatency prometheus.Histogram
	CommitMax     prometheus.Gauge
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
}

// NewMetrics registers the relay's metrics, with the Go and process
// collectors, in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_events_published_total",
			Help: "Outbox events durably published, by topic.",
		}, []string{"topic"}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "relay_publish_latency_seconds",
			Help: "Time from an event's created_at (its INSERT, in its transaction) to the sink's durable acknowledgement.",
			// About 26% apart from 0.1 ms to 100 s: fine enough for
			// percentiles read off the buckets.
			Buckets: prometheus.ExponentialBucketsRange(0.0001, 100, 60),
		}),
		LatencyMax: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_publish_latency_max_seconds",
			Help: "Largest publish latency observed since the process started.",
		}),
		CommitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_commit_latency_seconds",
			Help:    "Time from the commit of an event's transaction to the sink's durable acknowledgement, for readers that know commit times (cdc).",
			Buckets: prometheus.ExponentialBucketsRange(0.0001, 100, 60),
		}),
		CommitMax: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_commit_latency_max_seconds",
			Help: "Largest commit latency observed since the process started.",
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_batch_size_events",
			Help:    "Events per batch handed to the sink.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 15),
		}),
		Backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_backlog_rows",
			Help: "Rows in the outbox table not yet acknowledged (sampled).",
		}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_dead_letters_total",
			Help: "Events moved to the dead-letter table, by reason.",
		}, []string{"reason"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_errors_total",
			Help: "Pipeline failures that caused a restart, by stage (source, sink, ack, leader).",
		}, []string{"stage"}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_leader",
			Help: "1 while this process holds the outbox's leader lease, else 0.",
		}),
		LastPublished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_last_publish_timestamp_seconds",
			Help: "Unix time of the last durable acknowledgement.",
		}),
		PublishRate: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_publish_rate_events_per_second",
			Help: "Recent rate of acknowledged live events (smoothed over about a minute of backlog samples).",
		}),
		DrainETA: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_backlog_drain_seconds",
			Help: "Estimated time to drain the backlog at the recent publish rate: 0 when empty, -1 when nothing is being published.",
		}),
		ArchivePruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_archive_pruned_total",
			Help: "Archived events deleted because they were older than the retention (--retain).",
		}),
		Replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_replayed_events_total",
			Help: "Archived events republished by replay requests.",
		}),
		HeldKeys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_held_keys",
			Help: "Keys held behind a dead letter (dead-letter policy hold-key), sampled on the leader.",
		}),
		HeldEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_held_events",
			Help: "Events held behind their key's dead letter, waiting for its retry or discard, sampled on the leader.",
		}),
		DestinationWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_destination_waiting_since_timestamp_seconds",
			Help: "Unix time since when the destination refuses a topic for now (missing, unauthorized, throttled), by topic and reason; its events wait in the outbox. No sample while nothing waits.",
		}, []string{"topic", "reason"}),
	}
	m.HeartbeatAge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_heartbeat_age_seconds",
		Help: "On the leader: how long ago the newest heartbeat that went through reader, sink and acknowledgement was sent (/readyz fails above --ready-timeout); 0 elsewhere.",
	}, func() float64 {
		if f := m.heartbeatAge.Load(); f != nil {
			return (*f)()
		}
		return 0
	})
	m.Registry.MustRegister(m.Published, m.Latency, m.LatencyMax, m.CommitLatency, m.CommitMax, m.BatchSize, m.Backlog, m.DeadLetters, m.Errors, m.Leader, m.LastPublished,
		m.PublishRate, m.DrainETA, m.ArchivePruned, m.Replayed, m.HeldKeys, m.HeldEvents, m.HeartbeatAge,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Registry.MustRegister(m.DestinationWaiting)
	return m
}
