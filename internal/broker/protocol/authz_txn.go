package protocol

import (
	"slices"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// authorizeTxn checks the transaction requests against the TransactionalId
// resource (and the topics and groups they name), as Kafka does; known is
// false for any other request.
func (s *Server) authorizeTxn(c *conn, r kmsg.Request) (refused kmsg.Response, fix func(kmsg.Response), known bool) {
	switch req := r.(type) {
	case *kmsg.InitProducerIDRequest:
		if req.TransactionalID == nil || *req.TransactionalID == "" {
			// An idempotent producer's id writes nothing by itself.
			return nil, nil, true
		}
		if !s.canTxn(c, kmsg.ACLOperationWrite, *req.TransactionalID) {
			resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
			resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = txnDenied, -1, -1
			return resp, nil, true
		}
		return nil, nil, true
	case *kmsg.FindCoordinatorRequest:
		if req.CoordinatorType != coordinatorTransaction {
			return nil, nil, false
		}
		return nil, func(r kmsg.Response) {
			refuseCoordinators(req, r.(*kmsg.FindCoordinatorResponse), txnDenied, func(key string) bool {
				return s.canTxn(c, kmsg.ACLOperationDescribe, key)
			})
		}, true
	case *kmsg.AddPartitionsToTxnRequest:
		txnOK := s.canTxn(c, kmsg.ACLOperationWrite, req.TransactionalID)
		deniedTopic := map[string]bool{}
		for _, t := range req.Topics {
			if !s.canTopic(c, kmsg.ACLOperationWrite, t.Topic) {
				deniedTopic[t.Topic] = true
			}
		}
		if txnOK && len(deniedTopic) == 0 {
			return nil, nil, true
		}
		// Nothing is added when anything is refused.
		resp := req.ResponseKind().(*kmsg.AddPartitionsToTxnResponse)
		addPartitionsResponse(req, resp, func(tp broker.TxnPartition) int16 {
			switch {
			case !txnOK:
				return txnDenied
			case deniedTopic[tp.Topic]:
				return topicDenied
			}
			return kerr.OperationNotAttempted.Code
		})
		return resp, nil, true
	case *kmsg.AddOffsetsToTxnRequest:
		code := int16(0)
		switch {
		case !s.canTxn(c, kmsg.ACLOperationWrite, req.TransactionalID):
			code = txnDenied
		case !s.canGroup(c, kmsg.ACLOperationRead, req.Group):
			code = groupDenied
		}
		if code == 0 {
			return nil, nil, true
		}
		resp := req.ResponseKind().(*kmsg.AddOffsetsToTxnResponse)
		resp.ErrorCode = code
		return resp, nil, true
	case *kmsg.TxnOffsetCommitRequest:
		txnOK := s.canTxn(c, kmsg.ACLOperationWrite, req.TransactionalID)
		groupOK := s.canGroup(c, kmsg.ACLOperationRead, req.Group)
		deniedTopic := map[string]bool{}
		for _, t := range req.Topics {
			if !s.canTopic(c, kmsg.ACLOperationRead, t.Topic) {
				deniedTopic[t.Topic] = true
			}
		}
		if txnOK && groupOK && len(deniedTopic) == 0 {
			return nil, nil, true
		}
		resp := req.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
		txnOffsetCommitResponse(req, resp, func(topic string) int16 {
			switch {
			case !txnOK:
				return txnDenied
			case !groupOK:
				return groupDenied
			case deniedTopic[topic]:
				return topicDenied
			}
			return kerr.OperationNotAttempted.Code
		})
		return resp, nil, true
	case *kmsg.EndTxnRequest:
		if !s.canTxn(c, kmsg.ACLOperationWrite, req.TransactionalID) {
			resp := req.ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = txnDenied
			return resp, nil, true
		}
		return nil, nil, true
	case *kmsg.DescribeTransactionsRequest:
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.DescribeTransactionsResponse)
			for i := range resp.TransactionStates {
				ts := &resp.TransactionStates[i]
				if !s.canTxn(c, kmsg.ACLOperationDescribe, ts.TransactionalID) {
					id := ts.TransactionalID
					*ts = kmsg.NewDescribeTransactionsResponseTransactionState()
					ts.TransactionalID, ts.ErrorCode, ts.ProducerID, ts.ProducerEpoch, ts.StartTimestamp = id, txnDenied, -1, -1, -1
				}
			}
		}, true
	case *kmsg.ListTransactionsRequest:
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.ListTransactionsResponse)
			resp.TransactionStates = slices.DeleteFunc(resp.TransactionStates, func(ts kmsg.ListTransactionsResponseTransactionState) bool {
				return !s.canTxn(c, kmsg.ACLOperationDescribe, ts.TransactionalID)
			})
		}, true
	}
	return nil, nil, false
}
