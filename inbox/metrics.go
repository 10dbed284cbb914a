package inbox

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's Prometheus collectors. Several consumers may
// share one Metrics; their group label tells them apart.
type Metrics struct {
	Applied      *prometheus.CounterVec
	Duplicates   *prometheus.CounterVec
	DeadLettered *prometheus.CounterVec
	Pruned       *prometheus.CounterVec
	PruneErrors  *prometheus.CounterVec
	Handler      *prometheus.HistogramVec
	Lag          *prometheus.GaugeVec
}

// NewMetrics makes the collectors and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_records_applied_total", Help: "Records whose handler committed, by group and topic.",
		}, []string{"group", "topic"}),
		Duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_records_duplicate_total", Help: "Records skipped because their event id was already processed.",
		}, []string{"group", "topic"}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_records_dead_lettered_total", Help: "Records moved to the dead-letter table, failed or held behind a failed one.",
		}, []string{"group", "topic"}),
		Pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_processed_pruned_total", Help: "Processed event ids forgotten by the prune.",
		}, []string{"group"}),
		PruneErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_prune_errors_total", Help: "Prune passes that failed.",
		}, []string{"group"}),
		Handler: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inbox_handler_seconds", Help: "Time in the handler per record, failed attempts included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"group", "topic"}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inbox_lag_records", Help: "Records between the last one settled and the partition's high watermark, as of the last poll.",
		}, []string{"group", "topic", "partition"}),
	}
	if reg != nil {
		reg.MustRegister(m.Applied, m.Duplicates, m.DeadLettered, m.Pruned, m.PruneErrors, m.Handler, m.Lag)
	}
	return m
}

func (m *Metrics) handled(group, topic string, d time.Duration) {
	m.Handler.WithLabelValues(group, topic).Observe(d.Seconds())
}

func (m *Metrics) lag(group, topic string, p int32, n int64) {
	m.Lag.WithLabelValues(group, topic, strconv.Itoa(int(p))).Set(float64(max(n, 0)))
}

func (m *Metrics) forget(group, topic string, p int32) {
	m.Lag.DeleteLabelValues(group, topic, strconv.Itoa(int(p)))
}
