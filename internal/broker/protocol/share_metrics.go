package protocol

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	shareLagDesc = prometheus.NewDesc("relay_kafka_share_group_lag_records",
		"Records a share group has yet to finish: the log past the share partition's end offset plus the records in flight.",
		[]string{"group", "topic", "partition"}, nil)
	shareAcquiredDesc = prometheus.NewDesc("relay_kafka_share_group_acquired_records",
		"Records of a share partition acquired by a member and not yet acknowledged (under an acquisition lock).",
		[]string{"group", "topic", "partition"}, nil)
	shareMembersDesc = prometheus.NewDesc("relay_kafka_share_group_members",
		"Members of each share group.",
		[]string{"group"}, nil)
)

func (sc *shareCoordinator) describe(ch chan<- *prometheus.Desc) {
	ch <- shareLagDesc
	ch <- shareAcquiredDesc
	ch <- shareMembersDesc
}

// collect reports each share group's members and, per share partition,
// the lag and the records under a lock, at scrape time.
func (sc *shareCoordinator) collect(ch chan<- prometheus.Metric) {
	sc.mu.Lock()
	groups := make([]*shareGroup, 0, len(sc.groups))
	for _, g := range sc.groups {
		groups = append(groups, g)
	}
	sc.mu.Unlock()
	for _, g := range groups {
		g.mu.Lock()
		ch <- prometheus.MustNewConstMetric(shareMembersDesc, prometheus.GaugeValue, float64(len(g.members)), g.id)
		for tp, sp := range g.parts {
			_, hwm, err := sc.s.b.Offsets(tp.topic, tp.partition)
			if err != nil {
				continue
			}
			part := strconv.Itoa(int(tp.partition))
			ch <- prometheus.MustNewConstMetric(shareLagDesc, prometheus.GaugeValue, float64(shareLag(sp, hwm)), g.id, tp.topic, part)
			ch <- prometheus.MustNewConstMetric(shareAcquiredDesc, prometheus.GaugeValue, float64(sp.locked()), g.id, tp.topic, part)
		}
		g.mu.Unlock()
	}
}
