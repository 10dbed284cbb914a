package protocol

import (
	"context"
	"errors"
	"slices"
	"strconv"

	"github.com/outboxrelay/relay/internal/broker"
)

// Dead letters (KIP-1191): a share group with
// errors.deadletterqueue.topic.name set copies each record it archives
// because a member rejected it or it reached share.delivery.count.limit
// onto that topic (created with one partition if missing), with the
// record's key, value and headers (so an outbox event keeps its
// relay-event-id) and these headers added: __dlq.errors.group,
// __dlq.errors.topic, __dlq.errors.partition, __dlq.errors.offset,
// __dlq.errors.delivery.count and __dlq.errors.reason (rejected or
// delivery_limit). The copy is appended and made durable before the share
// state that archives the record is saved (persist), so a crash between
// the two may copy a record twice but never loses one; a failed copy is
// logged and the record archived all the same.

const cfgShareDLQTopic = "errors.deadletterqueue.topic.name"

// Why a record was archived.
const (
	deadRejected      = "rejected"
	deadDeliveryLimit = "delivery_limit"
)

// deadRec is a record archived by rejection or the delivery limit, not yet
// copied to the dead-letter topic.
type deadRec struct {
	offset int64
	count  int16
	reason string
}

// writeDeadLetters copies the group's newly archived records to its
// dead-letter topic, if it has one, and forgets them. g.mu held.
func (sc *shareCoordinator) writeDeadLetters(g *shareGroup) {
	for tp, sp := range g.parts {
		dead := sp.dead
		sp.dead = nil
		if len(dead) == 0 || g.cfg.DLQ == "" || tp.topic == g.cfg.DLQ {
			continue
		}
		if err := sc.copyDead(g, tp, dead); err != nil {
			sc.s.log.Error("writing share group dead letters failed; the records are archived without them",
				"group", g.id, "topic", tp.topic, "partition", tp.partition, "dead_letter_topic", g.cfg.DLQ, "records", len(dead), "err", err)
		}
	}
}

// copyDead reads the dead records of tp from the log and appends their
// copies to the dead-letter topic.
func (sc *shareCoordinator) copyDead(g *shareGroup, tp topicPart, dead []deadRec) error {
	ctx := context.Background()
	slices.SortFunc(dead, func(a, b deadRec) int { return int(a.offset - b.offset) })
	want := map[int64]deadRec{}
	for _, d := range dead {
		want[d.offset] = d
	}
	var out []broker.Record
	for from := dead[0].offset; len(want) > 0; {
		res, err := sc.s.b.FetchInto(ctx, tp.topic, tp.partition, from, 1<<20, nil)
		if err != nil && len(res.Batches) == 0 {
			return err
		}
		next := from
		for r, err := range broker.ReadRecords(res.Batches) {
			if err != nil {
				return err
			}
			next = max(next, r.Offset+1)
			d, ok := want[r.Offset]
			if !ok {
				continue
			}
			delete(want, r.Offset)
			hs := append(slices.Clone(r.Headers),
				broker.Header{Key: "__dlq.errors.group", Value: []byte(g.id)},
				broker.Header{Key: "__dlq.errors.topic", Value: []byte(tp.topic)},
				broker.Header{Key: "__dlq.errors.partition", Value: strconv.AppendInt(nil, int64(tp.partition), 10)},
				broker.Header{Key: "__dlq.errors.offset", Value: strconv.AppendInt(nil, r.Offset, 10)},
				broker.Header{Key: "__dlq.errors.delivery.count", Value: strconv.AppendInt(nil, int64(d.count), 10)},
				broker.Header{Key: "__dlq.errors.reason", Value: []byte(d.reason)})
			out = append(out, broker.Record{Key: r.Key, Value: r.Value, Headers: hs})
		}
		if next == from {
			break // past the log: the rest is gone
		}
		from = next
	}
	if len(out) == 0 {
		return nil
	}
	ti, err := sc.s.b.Topic(g.cfg.DLQ)
	if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
		ti, err = sc.s.b.CreateTopic(g.cfg.DLQ, broker.TopicConfig{Partitions: 1})
		if errors.Is(err, broker.ErrTopicExists) {
			ti, err = sc.s.b.Topic(g.cfg.DLQ)
		}
	}
	if err != nil {
		return err
	}
	part := tp.partition % int32(len(ti.Partitions))
	batch := broker.EncodeBatch(-1, -1, -1, out)
	_, err = sc.s.b.Append(ctx, g.cfg.DLQ, part, batch)
	return err
}
