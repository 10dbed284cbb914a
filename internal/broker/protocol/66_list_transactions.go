package protocol

import (
	"regexp"
	"slices"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// txnStates are the states ListTransactions filters by.
var txnStates = []string{
	string(broker.TxnEmpty), string(broker.TxnOngoing), string(broker.TxnPrepareCommit),
	string(broker.TxnPrepareAbort), string(broker.TxnCompleteCommit), string(broker.TxnCompleteAbort),
}

// handleListTransactions lists the transactional ids, filtered by state,
// producer id, how long the transaction has run (v1) and an id pattern
// (v2), as Kafka's does.
func (s *Server) handleListTransactions(req *kmsg.ListTransactionsRequest, resp *kmsg.ListTransactionsResponse) {
	for _, f := range req.StateFilters {
		if !slices.Contains(txnStates, f) {
			resp.UnknownStateFilters = append(resp.UnknownStateFilters, f)
		}
	}
	var pattern *regexp.Regexp
	if req.TransactionalIDPattern != nil && *req.TransactionalIDPattern != "" {
		re, err := regexp.Compile(*req.TransactionalIDPattern)
		if err != nil {
			resp.ErrorCode = kerr.InvalidRegularExpression.Code
			return
		}
		pattern = re
	}
	now := time.Now().UnixMilli()
	for _, st := range s.b.Transactions() {
		switch {
		case len(req.StateFilters) > 0 && !slices.Contains(req.StateFilters, string(st.State)):
			continue
		case len(req.ProducerIDFilters) > 0 && !slices.Contains(req.ProducerIDFilters, st.ProducerID):
			continue
		case req.DurationFilterMillis >= 0 && req.Version >= 1 && (st.StartMs < 0 || now-st.StartMs < req.DurationFilterMillis):
			continue
		case pattern != nil && !pattern.MatchString(st.TransactionalID):
			continue
		}
		ts := kmsg.NewListTransactionsResponseTransactionState()
		ts.TransactionalID, ts.ProducerID, ts.TransactionState = st.TransactionalID, st.ProducerID, string(st.State)
		resp.TransactionStates = append(resp.TransactionStates, ts)
	}
}
