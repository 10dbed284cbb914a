package protocol

import (
	"context"
	"errors"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleProduce appends each partition's record batch as sent (compressed
// batches are stored as they are) and returns the response together with
// wait, which blocks until those appends are durable under the broker's
// sync policy and records any failure in the response. The connection
// writes the response only after wait, so with acks=1 and acks=-1 alike a
// success means durable; meanwhile the next request on the connection is
// already being written to the log. acks=0 gets no response, but wait
// still runs. A request with a transactional id goes through the
// transaction coordinator's checks (broker.ProduceTxnAsync); transactional
// batches without one are refused.
func (s *Server) handleProduce(ctx context.Context, req *kmsg.ProduceRequest) (kmsg.Response, func()) {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	var code int16
	switch {
	case req.TransactionID != nil && req.Acks != -1:
		// Kafka requires acks=all of a transactional producer.
		code = kerr.InvalidRequiredAcks.Code
	case req.Acks != 0 && req.Acks != 1 && req.Acks != -1:
		code = kerr.InvalidRequiredAcks.Code
	}

	type pending struct {
		p    *kmsg.ProduceResponseTopicPartition
		wait func() error
	}
	var waits []pending
	resp.Topics = make([]kmsg.ProduceResponseTopic, len(req.Topics))
	for i, rt := range req.Topics {
		t := &resp.Topics[i]
		*t = kmsg.NewProduceResponseTopic()
		t.Topic = rt.Topic
		t.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(rt.Partitions))
		for j, rp := range rt.Partitions {
			p := &t.Partitions[j]
			*p = kmsg.NewProduceResponseTopicPartition()
			p.Partition = rp.Partition
			p.BaseOffset, p.LogAppendTime, p.LogStartOffset = -1, -1, -1
			if code != 0 {
				p.ErrorCode = code
				continue
			}
			if isOffsetsTopic(rt.Topic) {
				// As Kafka: clients cannot append to an internal topic.
				p.ErrorCode = kerr.InvalidTopicException.Code
				continue
			}
			var res broker.AppendResult
			var wait func() error
			var err error
			if req.TransactionID != nil && *req.TransactionID != "" {
				res, wait, err = s.b.ProduceTxnAsync(ctx, *req.TransactionID, rt.Topic, rp.Partition, rp.Records)
			} else {
				res, wait, err = s.b.ProduceAsync(ctx, rt.Topic, rp.Partition, rp.Records)
			}
			if err != nil {
				setProduceError(p, err)
				continue
			}
			p.BaseOffset, p.LogStartOffset = res.BaseOffset, res.LogStartOffset
			waits = append(waits, pending{p, wait})
		}
	}

	// One wait after another, in the writer: under SyncBeforeAck the
	// broker's journal makes every partition's appends durable with one
	// fsync, so the first wait's fsync covers the batches of the others
	// (and of any request appended meanwhile), which then return at once;
	// a goroutine per partition would only queue for that same fsync.
	wait := func() {
		for _, w := range waits {
			if err := w.wait(); err != nil {
				setProduceError(w.p, err)
			}
		}
	}
	if req.Acks == 0 {
		return nil, wait
	}
	return resp, wait
}

func setProduceError(p *kmsg.ProduceResponseTopicPartition, err error) {
	p.BaseOffset, p.LogStartOffset = -1, -1
	p.ErrorCode = broker.KafkaErrorCode(err)
	msg := err.Error()
	p.ErrorMessage = &msg
	var keyless *broker.KeylessRecordError
	if errors.As(err, &keyless) {
		rec := kmsg.NewProduceResponseTopicPartitionErrorRecord()
		rec.RelativeOffset, rec.ErrorMessage = keyless.Index, &msg
		p.ErrorRecords = append(p.ErrorRecords, rec)
	}
}
