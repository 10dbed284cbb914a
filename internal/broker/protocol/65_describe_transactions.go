package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleDescribeTransactions reports the coordinator's state of each
// transactional id asked for (TRANSACTIONAL_ID_NOT_FOUND for one never
// initialised).
func (s *Server) handleDescribeTransactions(req *kmsg.DescribeTransactionsRequest, resp *kmsg.DescribeTransactionsResponse) {
	for _, id := range req.TransactionalIDs {
		ts := kmsg.NewDescribeTransactionsResponseTransactionState()
		ts.TransactionalID = id
		st, ok := s.b.Transaction(id)
		if !ok {
			ts.ErrorCode, ts.ProducerID, ts.ProducerEpoch, ts.StartTimestamp = kerr.TransactionalIDNotFound.Code, -1, -1, -1
			resp.TransactionStates = append(resp.TransactionStates, ts)
			continue
		}
		ts.State, ts.TimeoutMillis, ts.StartTimestamp = string(st.State), st.TimeoutMs, st.StartMs
		ts.ProducerID, ts.ProducerEpoch = st.ProducerID, st.Epoch
		byTopic := map[string]int{}
		for _, tp := range st.Partitions {
			i, seen := byTopic[tp.Topic]
			if !seen {
				i = len(ts.Topics)
				byTopic[tp.Topic] = i
				t := kmsg.NewDescribeTransactionsResponseTransactionStateTopic()
				t.Topic = tp.Topic
				ts.Topics = append(ts.Topics, t)
			}
			ts.Topics[i].Partitions = append(ts.Topics[i].Partitions, tp.Partition)
		}
		resp.TransactionStates = append(resp.TransactionStates, ts)
	}
}
