package protocol

import (
	"context"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// offsetCommit is the commit of one partition of an OffsetCommit or
// TxnOffsetCommit request: the leader epoch -1 for a request version
// without one (hasEpoch false), the metadata empty when it is null.
func offsetCommit(topic string, part int32, offset int64, leaderEpoch int32, hasEpoch bool, metadata *string) broker.OffsetCommit {
	oc := broker.OffsetCommit{Topic: topic, Partition: part, Offset: offset, LeaderEpoch: -1}
	if hasEpoch {
		oc.LeaderEpoch = leaderEpoch
	}
	if metadata != nil {
		oc.Metadata = *metadata
	}
	return oc
}

// handleOffsetCommit stores offsets durably in the broker (one fsync per
// request). A member of a live group must name its current generation; a
// generation below zero is a standalone commit, allowed while the group has
// no members, as in Kafka. Commits for unknown partitions fail per
// partition and do not stop the others.
func (s *Server) handleOffsetCommit(ctx context.Context, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse) {
	generation := req.Generation
	if req.Version < 1 {
		generation = -1
	}
	var parts []topicPart
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			parts = append(parts, topicPart{rt.Topic, rp.Partition})
		}
	}
	code := s.groups.checkAnyCommit(req.Group, req.MemberID, req.InstanceID, generation, parts, req.Version >= 9)
	if req.Group == "" {
		code = kerr.InvalidGroupID.Code
	}

	var commits []broker.OffsetCommit
	codes := make([][]int16, len(req.Topics))
	for i, rt := range req.Topics {
		codes[i] = make([]int16, len(rt.Partitions))
		for j, rp := range rt.Partitions {
			if code != 0 {
				codes[i][j] = code
				continue
			}
			if _, _, err := s.b.Offsets(rt.Topic, rp.Partition); err != nil {
				codes[i][j] = broker.KafkaErrorCode(err)
				continue
			}
			commits = append(commits, offsetCommit(rt.Topic, rp.Partition, rp.Offset, rp.LeaderEpoch, req.Version >= 6, rp.Metadata))
		}
	}
	if len(commits) > 0 {
		err := s.b.CommitOffsets(ctx, req.Group, commits)
		if err == nil {
			s.offsets.appendCommits(req.Group, commits, time.Now())
		}
		if err != nil {
			ec := broker.KafkaErrorCode(err)
			for i := range codes {
				for j := range codes[i] {
					if codes[i][j] == 0 {
						codes[i][j] = ec
					}
				}
			}
		}
	}
	for i, rt := range req.Topics {
		t := kmsg.NewOffsetCommitResponseTopic()
		t.Topic = rt.Topic
		for j, rp := range rt.Partitions {
			p := kmsg.NewOffsetCommitResponseTopicPartition()
			p.Partition, p.ErrorCode = rp.Partition, codes[i][j]
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
}

// checkAnyCommit decides whether a commit of these partitions from this
// member may be stored, for a KIP-848 consumer group (the generation is
// the member epoch; the commit must come in OffsetCommit v9+ unless it is
// transactional, newFormat) or a classic one.
func (c *coordinator) checkAnyCommit(groupID, memberID string, instanceID *string, generation int32, parts []topicPart, newFormat bool) int16 {
	if g, _ := c.lockConsumerGroup(groupID, false); g != nil {
		defer g.mu.Unlock()
		if generation < 0 && len(g.members) == 0 {
			return 0
		}
		return g.checkCommit(memberID, generation, newFormat, parts)
	}
	return c.checkCommit(groupID, memberID, instanceID, generation)
}

// checkCommit decides whether a commit from this member of a classic
// group may be stored.
func (c *coordinator) checkCommit(groupID, memberID string, instanceID *string, generation int32) int16 {
	g := c.lockGroup(groupID, false)
	if g == nil {
		if generation < 0 {
			return 0
		}
		return kerr.IllegalGeneration.Code
	}
	defer g.mu.Unlock()
	if generation < 0 && len(g.members) == 0 {
		return 0
	}
	m, code := g.validMember(memberID, instanceID, generation)
	if code != 0 {
		return code
	}
	if g.state == groupCompletingRebalance {
		return kerr.RebalanceInProgress.Code
	}
	g.touch(m)
	return 0
}
