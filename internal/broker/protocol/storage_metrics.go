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
	// Per topic, always exported: the sums of the per-partition series.
	topicRecordsDesc = prometheus.NewDesc("relay_broker_topic_records_appended_total",
		"Records ever appended to the topic: the sum of its partitions' log end offsets.",
		[]string{"topic"}, nil)
	topicAppendedBytesDesc = prometheus.NewDesc("relay_broker_topic_appended_bytes_total",
		"Bytes of record batches appended to the topic since the process opened it.",
		[]string{"topic"}, nil)
	topicBytesDesc = prometheus.NewDesc("relay_broker_topic_bytes",
		"Bytes of the topic's logs on disk.",
		[]string{"topic"}, nil)
	partitionSeriesDesc = prometheus.NewDesc("relay_broker_partition_series_exported",
		"1 while the per-partition series (relay_broker_partition_*) are exported, 0 while there are more partitions than --metrics-partition-series-max and --metrics-per-partition is not set.",
		nil, nil)
	fsyncDesc = prometheus.NewDesc("relay_broker_fsync_duration_seconds",
		"Latency of the embedded broker's fsyncs, by file: journal (the write-ahead journal), segment (partition logs), checkpoint (recovery points, committed offsets, transaction state), directory.",
		[]string{"file"}, nil)
)

// DefaultPartitionSeriesMax is PartitionSeries.Max's default.
const DefaultPartitionSeriesMax = 1000

// PartitionSeries decides whether the per-partition storage series are
// exported: three series per partition would be 24,000 at 8,000
// partitions, so above Max partitions (over all topics) only the
// per-topic sums are, unless Always.
type PartitionSeries struct {
	// Max is the partition count above which the per-partition series
	// are off (0: DefaultPartitionSeriesMax).
	Max int
	// Always exports them at any count.
	Always bool
}

func (p PartitionSeries) on(partitions int) bool {
	limit := p.Max
	if limit <= 0 {
		limit = DefaultPartitionSeriesMax
	}
	return p.Always || partitions <= limit
}

// StorageCollector returns a prometheus.Collector of b's storage state:
// whether it may acknowledge (Health), the lost ranges of every partition
// (count and offsets), the background check's progress, the fsync latency
// histograms, each topic's appended records and bytes and size, and, as
// parts allows, the same per partition (hot partitions). Server's
// Collector includes it, with its Config's PartitionSeries.
func StorageCollector(b *broker.Broker, parts PartitionSeries) prometheus.Collector {
	return storageCollector{b, parts}
}

type storageCollector struct {
	b     *broker.Broker
	parts PartitionSeries
}

func (c storageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storageHealthyDesc, lostRecordsTotalDesc, lostRangesTotalDesc, lostRecordsDesc, lostRangeDesc, scrubPassesDesc, scrubBytesDesc,
		appendedRecordsDesc, appendedBytesDesc, partitionBytesDesc, topicRecordsDesc, topicAppendedBytesDesc, topicBytesDesc, partitionSeriesDesc, fsyncDesc} {
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
	topics := c.b.Topics()
	n := 0
	for _, t := range topics {
		n += len(t.Partitions)
	}
	perPartition := c.parts.on(n)
	exported := 0.0
	if perPartition {
		exported = 1
	}
	ch <- prometheus.MustNewConstMetric(partitionSeriesDesc, prometheus.GaugeValue, exported)
	for _, t := range topics {
		var tRecords, tAppended, tBytes int64
		for _, p := range t.Partitions {
			tRecords, tAppended, tBytes = tRecords+p.LogEndOffset, tAppended+p.AppendedBytes, tBytes+p.Bytes
		}
		ch <- prometheus.MustNewConstMetric(topicRecordsDesc, prometheus.CounterValue, float64(tRecords), t.Name)
		ch <- prometheus.MustNewConstMetric(topicAppendedBytesDesc, prometheus.CounterValue, float64(tAppended), t.Name)
		ch <- prometheus.MustNewConstMetric(topicBytesDesc, prometheus.GaugeValue, float64(tBytes), t.Name)
		for _, p := range t.Partitions {
			part := strconv.Itoa(int(p.Partition))
			if perPartition {
				ch <- prometheus.MustNewConstMetric(appendedRecordsDesc, prometheus.CounterValue, float64(p.LogEndOffset), t.Name, part)
				ch <- prometheus.MustNewConstMetric(appendedBytesDesc, prometheus.CounterValue, float64(p.AppendedBytes), t.Name, part)
				ch <- prometheus.MustNewConstMetric(partitionBytesDesc, prometheus.GaugeValue, float64(p.Bytes), t.Name, part)
			}
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
	for _, h := range c.b.FsyncStats() {
		buckets := make(map[float64]uint64, len(broker.FsyncBuckets))
		for i, ub := range broker.FsyncBuckets {
			buckets[ub] = h.Buckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(fsyncDesc, h.Count, h.Sum.Seconds(), buckets, h.File)
	}
}
