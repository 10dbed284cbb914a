package protocol

import (
	"strconv"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/prometheus/client_golang/prometheus"
)

// GroupLag is one group's position on one partition.
type GroupLag struct {
	Group string
	broker.PartitionLag
}

// GroupLags reports, for every group with committed offsets, the lag on
// each partition it committed on (records not yet consumed) and the lag
// against retention (committed offset minus the log start offset: how far
// the group is from losing unread records to retention).
func (s *Server) GroupLags() []GroupLag {
	var out []GroupLag
	for _, g := range s.b.Groups() {
		lags, err := s.b.GroupLag(g)
		if err != nil {
			continue
		}
		for _, l := range lags {
			out = append(out, GroupLag{Group: g, PartitionLag: l})
		}
	}
	return out
}

var (
	lagDesc = prometheus.NewDesc("relay_kafka_group_lag_records",
		"Records a consumer group has yet to consume: high watermark minus committed offset.",
		[]string{"group", "topic", "partition"}, nil)
	retentionDesc = prometheus.NewDesc("relay_kafka_group_retention_margin_records",
		"Committed offset minus the log start offset: records retention may still delete before the group loses unread data (zero or below means it has).",
		[]string{"group", "topic", "partition"}, nil)
	membersDesc = prometheus.NewDesc("relay_kafka_group_members",
		"Members of each live consumer group.",
		[]string{"group", "state"}, nil)
)

// Collector returns a prometheus.Collector of consumer group lag, lag
// against retention and membership, computed at scrape time, and of the
// broker's storage state (StorageCollector).
func (s *Server) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- retentionDesc
	ch <- membersDesc
	c.s.share.describe(ch)
	storageCollector{c.s.b, c.s.cfg.PartitionSeries}.Describe(ch)
	c.s.describeListener(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.s.GroupLags() {
		part := strconv.Itoa(int(l.Partition))
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(l.Lag), l.Group, l.Topic, part)
		ch <- prometheus.MustNewConstMetric(retentionDesc, prometheus.GaugeValue, float64(l.RetentionMargin), l.Group, l.Topic, part)
	}
	for _, g := range c.s.groups.snapshot() {
		g.mu.Lock()
		id, state, n := g.id, g.state, len(g.members)
		g.mu.Unlock()
		if state != groupDead {
			ch <- prometheus.MustNewConstMetric(membersDesc, prometheus.GaugeValue, float64(n), id, state.String())
		}
	}
	for _, g := range c.s.groups.consumerSnapshot() {
		g.mu.Lock()
		id, state, n, dead := g.id, g.state(), len(g.members), g.dead
		g.mu.Unlock()
		if !dead {
			ch <- prometheus.MustNewConstMetric(membersDesc, prometheus.GaugeValue, float64(n), id, state)
		}
	}
	c.s.share.collect(ch)
	storageCollector{c.s.b, c.s.cfg.PartitionSeries}.Collect(ch)
	c.s.collectListener(ch)
}
