package protocol

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// handleCreatePartitions raises partition counts. More partitions may
// move keys to other partitions: each topic's answer carries, as its
// error message, the report of how many of the keys in its log would move
// (also on a validate-only request, which succeeds). An increase that
// moves no key (an empty topic, only keyless records, or keys that all
// stay) is made; one that moves keys is a migration, refused with
// POLICY_VIOLATION unless Config.AllowRepartition says yes
// (broker.AddPartitionsMovingNoKey). A lower count is always refused
// (INVALID_PARTITIONS), and so are manual replica assignments.
func (s *Server) handleCreatePartitions(ctx context.Context, req *kmsg.CreatePartitionsRequest, resp *kmsg.CreatePartitionsResponse) {
	seen := timesNamed(req.Topics, func(rt kmsg.CreatePartitionsRequestTopic) string { return rt.Topic })
	for _, rt := range req.Topics {
		t := kmsg.NewCreatePartitionsResponseTopic()
		t.Topic = rt.Topic
		code, msg := s.createPartitions(ctx, rt, seen[rt.Topic] > 1, req.ValidateOnly)
		t.ErrorCode = code
		if msg != "" {
			t.ErrorMessage = &msg
		}
		resp.Topics = append(resp.Topics, t)
	}
}

func (s *Server) createPartitions(ctx context.Context, rt kmsg.CreatePartitionsRequestTopic, duplicate, validateOnly bool) (int16, string) {
	switch {
	case duplicate:
		return kerr.InvalidRequest.Code, fmt.Sprintf("topic %q named more than once", rt.Topic)
	case len(rt.Assignment) > 0:
		return kerr.InvalidReplicaAssignment.Code, "manual replica assignment is not supported"
	}
	if !validateOnly && (s.cfg.AllowRepartition == nil || !s.cfg.AllowRepartition()) {
		report, err := s.b.AddPartitionsMovingNoKey(ctx, rt.Topic, rt.Count)
		switch {
		case errors.Is(err, broker.ErrKeysWouldMove):
			return kerr.PolicyViolation.Code, report.String() + ": a partition increase that moves keys is a migration, refused unless the relay runs with --allow-repartition (see docs/topics.md)"
		case errors.Is(err, broker.ErrInvalidPartitions):
			return kerr.InvalidPartitions.Code, err.Error()
		case err != nil:
			return broker.KafkaErrorCode(err), err.Error()
		}
		s.log.Info("raised a topic's partition count, moving no key", "topic", rt.Topic, "from", report.From, "to", report.To,
			"keys", report.Keys, "keyless_records", report.KeylessRecords)
		return 0, report.String()
	}
	report, err := s.b.KeyMovement(ctx, rt.Topic, rt.Count)
	if err != nil {
		return broker.KafkaErrorCode(err), err.Error()
	}
	if validateOnly {
		return 0, report.String()
	}
	if _, err := s.b.AddPartitions(rt.Topic, rt.Count); err != nil {
		if errors.Is(err, broker.ErrInvalidPartitions) {
			return kerr.InvalidPartitions.Code, err.Error()
		}
		return broker.KafkaErrorCode(err), err.Error()
	}
	s.log.Warn("raised a topic's partition count", "topic", rt.Topic, "from", report.From, "to", report.To,
		"keys", report.Keys, "keys_moved", report.Moving)
	return 0, report.String()
}
