package protocol

import (
	"context"
	"errors"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleAddPartitionsToTxn adds partitions to the producer's transaction
// (v0-3, the client's request). As in Kafka, a request with an unknown
// partition adds nothing: that partition gets UNKNOWN_TOPIC_OR_PARTITION
// and the others OPERATION_NOT_ATTEMPTED.
func (s *Server) handleAddPartitionsToTxn(ctx context.Context, req *kmsg.AddPartitionsToTxnRequest, resp *kmsg.AddPartitionsToTxnResponse) {
	var parts []broker.TxnPartition
	for _, rt := range req.Topics {
		for _, p := range rt.Partitions {
			parts = append(parts, broker.TxnPartition{Topic: rt.Topic, Partition: p})
		}
	}
	unknown := map[broker.TxnPartition]bool{}
	for _, tp := range parts {
		if _, _, err := s.b.Offsets(tp.Topic, tp.Partition); err != nil {
			unknown[tp] = true
		}
	}
	var code int16
	if len(unknown) == 0 {
		err := s.b.AddTxnPartitions(ctx, req.TransactionalID, broker.ProducerID{ID: req.ProducerID, Epoch: req.ProducerEpoch}, parts)
		code = txnErrorCode(err, req.Version, 2)
		if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
			code = kerr.UnknownTopicOrPartition.Code
		}
	}
	addPartitionsResponse(req, resp, func(tp broker.TxnPartition) int16 {
		switch {
		case unknown[tp]:
			return kerr.UnknownTopicOrPartition.Code
		case len(unknown) > 0:
			return kerr.OperationNotAttempted.Code
		}
		return code
	})
}

// addPartitionsResponse answers every partition of req in resp with
// code(p).
func addPartitionsResponse(req *kmsg.AddPartitionsToTxnRequest, resp *kmsg.AddPartitionsToTxnResponse, code func(broker.TxnPartition) int16) {
	for _, rt := range req.Topics {
		t := kmsg.NewAddPartitionsToTxnResponseTopic()
		t.Topic = rt.Topic
		for _, p := range rt.Partitions {
			rp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p, code(broker.TxnPartition{Topic: rt.Topic, Partition: p})
			t.Partitions = append(t.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, t)
	}
}
