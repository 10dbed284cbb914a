package protocol

import (
	"context"
	"errors"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleTxnOffsetCommit records a group's offsets in the producer's
// transaction: they are committed with it, or dropped when it aborts.
// From v3 on, a commit naming a member and generation (KIP-447) is checked
// against the live group as OffsetCommit is, so a zombie of a past
// generation cannot commit.
func (s *Server) handleTxnOffsetCommit(ctx context.Context, req *kmsg.TxnOffsetCommitRequest, resp *kmsg.TxnOffsetCommitResponse) {
	var code int16
	if req.Version >= 3 && req.Generation >= 0 {
		var parts []topicPart
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				parts = append(parts, topicPart{rt.Topic, rp.Partition})
			}
		}
		code = s.groups.checkAnyCommit(req.Group, req.MemberID, req.InstanceID, req.Generation, parts, true)
	}
	var commits []broker.OffsetCommit
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			commits = append(commits, offsetCommit(rt.Topic, rp.Partition, rp.Offset, rp.LeaderEpoch, req.Version >= 2, rp.Metadata))
		}
	}
	if code == 0 && len(commits) > 0 {
		err := s.b.TxnCommitOffsets(ctx, req.TransactionalID, broker.ProducerID{ID: req.ProducerID, Epoch: req.ProducerEpoch}, req.Group, commits)
		code = txnErrorCode(err, req.Version, 3)
		if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
			code = kerr.UnknownTopicOrPartition.Code
		}
	}
	txnOffsetCommitResponse(req, resp, func(string) int16 { return code })
}

// txnOffsetCommitResponse answers every partition of req in resp with the
// code of its topic.
func txnOffsetCommitResponse(req *kmsg.TxnOffsetCommitRequest, resp *kmsg.TxnOffsetCommitResponse, code func(topic string) int16) {
	for _, rt := range req.Topics {
		t := kmsg.NewTxnOffsetCommitResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			p := kmsg.NewTxnOffsetCommitResponseTopicPartition()
			p.Partition, p.ErrorCode = rp.Partition, code(rt.Topic)
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
}
