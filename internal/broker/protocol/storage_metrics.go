package protocol

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/internal/broker"
)

var (
	storageHealthyDesc = prometheus.NewDesc("relay_broker_storage_healthy",
		"1 while the embedded broker may acknowledge; 0 after an fsync failed, until it was reopened from disk.",
		nil, nil)
	lostRecordsTotalDesc = prometheus.NewDesc("relay_broker_lost_records",
		"Offsets the embedded broker found damaged or missing and could not repair, over all partitions.",
		nil, nil)
	lostRangesTotalDesc = prometheus.NewDesc("relay_broker_lost_ranges",
		"Lost offset ranges over all partitions (a vanished partition directory counts as one range of unknown size).",
		nil, nil)
	lostRecordsDesc = prometheus.NewDesc("relay_broker_partition_lost_records",
		"Offsets of a partition found damaged or missing and not repaired.",
		[]string{"topic", "partition"}, nil)
	lostRangeDesc = prometheus.NewDesc("relay_broker_lost_range_records",
		"One lost offset range of a partition, by its first and last offset (last -1: unknown extent); the value is its record count.",
		[]string{"topic", "partition", "first_offset", "last_offset"}, nil)
	scrubPassesDesc = prometheus.NewDesc("relay_broker_scrub_passes_total",
		"Completed passes of the background check that verifies every stored batch's CRC.",
		nil, nil)
	scrubBytesDesc = prometheus.NewDesc("relay_broker_scrub_bytes_total",
		"Bytes the background check verified.",
		nil, nil)
	// Per partition, for hot partitions (a skewed key): rate() of these is
	// each partition's append rate.
	appendedRecordsDesc = prometheus.NewDesc("relay_broker_partition_records_appended_total",
		"Records ever appended to the partition: its log end offset (kept across restarts).",
		[]string{"topic", "partition"}, nil)
	appendedBytesDesc = prometheus.NewDesc("relay_broker_partition_appended_bytes_total",
		"Bytes of record batches appended to the partition since the process opened it.",
		[]string{"topic", "partition"}, nil)
	partitionBytesDesc = prometheus.NewDesc("relay_broker_partition_bytes",
		"Bytes of the partition's log on disk (what retention keeps).",
		[]string{"topic", "partition"}, nil)
)

// StorageCollector returns a prometheus.Collector of b's storage state:
// whether it may acknowledge (Health), the lost ranges of every partition
// (count and offsets), the background check's progress, and each
// partition's appended records and bytes and size (hot partitions).
// Server's Collector includes it.
func StorageCollector(b *broker.Broker) prometheus.Collector { return storageCollector{b} }

type storageCollector struct{ b *broker.Broker }

func (c storageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storageHealthyDesc, lostRecordsTotalDesc, lostRangesTotalDesc, lostRecordsDesc, lostRangeDesc, scrubPassesDesc, scrubBytesDesc,
		appendedRecordsDesc, appendedBytesDesc, partitionBytesDesc} {
		ch <- d
	}
}

func (c storageCollector) Collect(ch chan<- prometheus.Metric) {
	healthy := 1.0
	if c.b.Health() != nil {
		healthy = 0
	}
	ch <- prometheus.MustNewConstMetric(storageHealthyDesc, prometheus.GaugeValue, healthy)
	var records, ranges int64
	for _, t := range c.b.Topics() {
		for _, p := range t.Partitions {
			part := strconv.Itoa(int(p.Partition))
			ch <- prometheus.MustNewConstMetric(appendedRecordsDesc, prometheus.CounterValue, float64(p.LogEndOffset), t.Name, part)
			ch <- prometheus.MustNewConstMetric(appendedBytesDesc, prometheus.CounterValue, float64(p.AppendedBytes), t.Name, part)
			ch <- prometheus.MustNewConstMetric(partitionBytesDesc, prometheus.GaugeValue, float64(p.Bytes), t.Name, part)
			if len(p.Lost) == 0 {
				continue
			}
			var n int64
			for _, r := range p.Lost {
				n += r.Records()
				ch <- prometheus.MustNewConstMetric(lostRangeDesc, prometheus.GaugeValue, float64(r.Records()),
					t.Name, part, strconv.FormatInt(r.First, 10), strconv.FormatInt(r.Last, 10))
			}
			ch <- prometheus.MustNewConstMetric(lostRecordsDesc, prometheus.GaugeValue, float64(n), t.Name, part)
			records += n
			ranges += int64(len(p.Lost))
		}
	}
	ch <- prometheus.MustNewConstMetric(lostRecordsTotalDesc, prometheus.GaugeValue, float64(records))
	ch <- prometheus.MustNewConstMetric(lostRangesTotalDesc, prometheus.GaugeValue, float64(ranges))
	st := c.b.ScrubStatus()
	ch <- prometheus.MustNewConstMetric(scrubPassesDesc, prometheus.CounterValue, float64(st.Passes))
	ch <- prometheus.MustNewConstMetric(scrubBytesDesc, prometheus.CounterValue, float64(st.BytesChecked))
}
