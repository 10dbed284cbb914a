package protocol

import (
	"context"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleAddOffsetsToTxn adds a consumer group to the producer's
// transaction, so that TxnOffsetCommit may commit its offsets in it.
func (s *Server) handleAddOffsetsToTxn(ctx context.Context, req *kmsg.AddOffsetsToTxnRequest, resp *kmsg.AddOffsetsToTxnResponse) {
	err := s.b.AddTxnGroup(ctx, req.TransactionalID, broker.ProducerID{ID: req.ProducerID, Epoch: req.ProducerEpoch}, req.Group)
	resp.ErrorCode = txnErrorCode(err, req.Version, 2)
}
