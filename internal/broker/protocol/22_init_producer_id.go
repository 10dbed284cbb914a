package protocol

import (
	"context"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleInitProducerID gives idempotent producers a fresh identity.
// Transactions are not supported, so a transactional id is refused. A
// producer asking to bump its epoch (KIP-360) also gets a fresh id at epoch
// 0, which clients accept the same way.
func (s *Server) handleInitProducerID(ctx context.Context, req *kmsg.InitProducerIDRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil {
		resp.ErrorCode = kerr.InvalidRequest.Code
		return resp
	}
	id, err := s.b.InitProducerID(ctx, "")
	if err != nil {
		resp.ErrorCode = broker.KafkaErrorCode(err)
		return resp
	}
	resp.ProducerID, resp.ProducerEpoch = id.ID, id.Epoch
	return resp
}
