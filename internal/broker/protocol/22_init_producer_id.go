package protocol

import (
	"context"
	"errors"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleInitProducerID gives idempotent producers a fresh identity, and a
// transactional producer its transactional id's producer id at the next
// epoch, which fences older instances and aborts a transaction they left
// open (broker.InitTransactional). An idempotent producer asking to bump
// its epoch (KIP-360) gets a fresh id at epoch 0, which clients accept the
// same way.
func (s *Server) handleInitProducerID(ctx context.Context, req *kmsg.InitProducerIDRequest, resp *kmsg.InitProducerIDResponse) {
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if txnID := req.TransactionalID; txnID != nil && *txnID != "" {
		cur := broker.ProducerID{ID: -1, Epoch: -1}
		if req.Version >= 3 {
			cur = broker.ProducerID{ID: req.ProducerID, Epoch: req.ProducerEpoch}
		}
		id, err := s.b.InitTransactional(ctx, *txnID, time.Duration(req.TransactionTimeoutMillis)*time.Millisecond, cur)
		if err != nil {
			resp.ErrorCode = txnErrorCode(err, req.Version, 4)
			return
		}
		resp.ProducerID, resp.ProducerEpoch = id.ID, id.Epoch
		return
	}
	id, err := s.b.InitProducerID(ctx, "")
	if err != nil {
		resp.ErrorCode = broker.KafkaErrorCode(err)
		return
	}
	resp.ProducerID, resp.ProducerEpoch = id.ID, id.Epoch
}

// txnErrorCode maps a coordinator error to the code a request of version v
// may carry: PRODUCER_FENCED exists from version fencedSince on, before it
// clients expect INVALID_PRODUCER_EPOCH.
func txnErrorCode(err error, v, fencedSince int16) int16 {
	code := broker.KafkaErrorCode(err)
	if code == kerr.ProducerFenced.Code && v < fencedSince {
		return kerr.InvalidProducerEpoch.Code
	}
	if errors.Is(err, broker.ErrUnknownTransactionalID) {
		// What Kafka answers a producer id for an id it does not know.
		return kerr.InvalidProducerIDMapping.Code
	}
	return code
}
