package protocol

import (
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/topicname"
)

// offsetsTopicPartitions is the partition count __consumer_offsets is
// listed with (offsetsTopicMetadata).
const offsetsTopicPartitions = 1

// offsetsLogMax bounds the commits the __consumer_offsets view keeps in
// memory; older ones leave it as retention would (its start offset rises).
const offsetsLogMax = 100_000

// isOffsetsTopic reports whether topic is __consumer_offsets, which the
// server answers itself, read-only, rather than from the log.
func isOffsetsTopic(topic string) bool { return topic == topicname.ConsumerOffsets }

// offsetsLog is the read-only __consumer_offsets partition this server
// serves: one record per offset committed through it (OffsetCommit) since
// it started, keyed and encoded as Kafka writes them (key version 1,
// value version 1), for lag checkers such as Burrow that read commits
// there. It is a view, not the store: committed offsets are durable in
// the broker (OffsetCommit, OffsetFetch); this log is in memory, starts
// empty at each start, holds the last offsetsLogMax commits, and does not
// show transactional commits or commits made through another listener.
type offsetsLog struct {
	mu      sync.Mutex
	start   int64
	records []broker.Record
	grew    chan struct{}
}

func newOffsetsLog() *offsetsLog { return &offsetsLog{grew: make(chan struct{})} }

// appendCommits adds one record per commit of group and wakes fetches
// waiting on the partition.
func (l *offsetsLog) appendCommits(group string, commits []broker.OffsetCommit, now time.Time) {
	if len(commits) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range commits {
		key := kmsg.OffsetCommitKey{Version: 1, Group: group, Topic: c.Topic, Partition: c.Partition}
		value := kmsg.OffsetCommitValue{Version: 1, Offset: c.Offset, Metadata: c.Metadata,
			CommitTimestamp: now.UnixMilli(), ExpireTimestamp: -1}
		l.records = append(l.records, broker.Record{Timestamp: now, Key: key.AppendTo(nil), Value: value.AppendTo(nil)})
	}
	if drop := len(l.records) - offsetsLogMax; drop > 0 {
		l.records = append(l.records[:0:0], l.records[drop:]...)
		l.start += int64(drop)
	}
	close(l.grew)
	l.grew = make(chan struct{})
}

// watch returns a channel closed by the next append.
func (l *offsetsLog) watch() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grew
}

// bounds returns the log start offset and the high watermark.
func (l *offsetsLog) bounds() (int64, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.start, l.start + int64(len(l.records))
}

// fetch answers a fetch of __consumer_offsets: one uncompressed batch of
// the records from the fetch offset, at least one and otherwise no more
// than the partition's byte limit; an offset outside the log is out of
// range.
func (l *offsetsLog) fetch(rp kmsg.FetchRequestTopicPartition, p *kmsg.FetchResponseTopicPartition) {
	if rp.Partition < 0 || rp.Partition >= offsetsTopicPartitions {
		p.ErrorCode = kerr.UnknownTopicOrPartition.Code
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	end := l.start + int64(len(l.records))
	p.HighWatermark, p.LastStableOffset, p.LogStartOffset = end, end, l.start
	if rp.FetchOffset < l.start || rp.FetchOffset > end {
		p.ErrorCode = kerr.OffsetOutOfRange.Code
		return
	}
	from := int(rp.FetchOffset - l.start)
	to, size := from, broker.BatchHeaderSize
	for to < len(l.records) && (to == from || size+recordBound(l.records[to]) <= int(rp.PartitionMaxBytes)) {
		size += recordBound(l.records[to])
		to++
	}
	if to == from {
		return
	}
	batch, err := broker.AppendBatch(nil, broker.BatchOptions{ProducerID: -1, BaseOffset: rp.FetchOffset}, l.records[from:to])
	if err != nil {
		p.ErrorCode = kerr.UnknownServerError.Code
		return
	}
	p.RecordBatches = batch
}

// recordBound is an upper bound of the encoded size of a record of the
// offsets log.
func recordBound(r broker.Record) int { return 32 + len(r.Key) + len(r.Value) }

// listOffset answers ListOffsets on __consumer_offsets: earliest and
// earliest-local are the log start, latest the high watermark; the largest
// timestamp, latest-tiered and a time find nothing (-1).
func (l *offsetsLog) listOffset(rp kmsg.ListOffsetsRequestTopicPartition, p *kmsg.ListOffsetsResponseTopicPartition) int16 {
	if rp.Partition < 0 || rp.Partition >= offsetsTopicPartitions {
		return kerr.UnknownTopicOrPartition.Code
	}
	start, end := l.bounds()
	switch rp.Timestamp {
	case listEarliest, listEarliestLocal:
		p.Offset = start
	case listLatest:
		p.Offset = end
	case listMaxTime, listLatestTiered:
		p.LeaderEpoch = -1
	default:
		if rp.Timestamp < 0 {
			return kerr.InvalidRequest.Code
		}
		p.LeaderEpoch = -1
	}
	return 0
}
