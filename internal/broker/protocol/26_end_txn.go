package protocol

import (
	"context"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleEndTxn commits or aborts the producer's transaction; it answers
// once the markers are durable in every partition of the transaction and,
// on commit, the transaction's group offsets are stored.
func (s *Server) handleEndTxn(ctx context.Context, req *kmsg.EndTxnRequest, resp *kmsg.EndTxnResponse) {
	err := s.b.EndTxn(ctx, req.TransactionalID, broker.ProducerID{ID: req.ProducerID, Epoch: req.ProducerEpoch}, req.Commit)
	resp.ErrorCode = txnErrorCode(err, req.Version, 2)
}
