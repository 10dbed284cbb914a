package protocol

import (
	"context"
	"sync"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleProduce appends each partition's record batch as sent (compressed
// batches are stored as they are) and returns the response together with
// wait, which blocks until those appends are durable under the broker's
// sync policy and records any failure in the response; the fsyncs start
// at once, overlapping each other and those of earlier requests. The connection writes the response only after wait, so
// with acks=1 and acks=-1 alike a success means durable; meanwhile the next
// request on the connection is already being written to the log. acks=0
// gets no response, but wait still runs.
func (s *Server) handleProduce(ctx context.Context, req *kmsg.ProduceRequest) (kmsg.Response, func()) {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	var code int16
	switch {
	case req.TransactionID != nil:
		code = kerr.InvalidRequest.Code
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
			res, wait, err := s.b.AppendAsync(ctx, rt.Topic, rp.Partition, rp.Records)
			if err != nil {
				setProduceError(p, err)
				continue
			}
			p.BaseOffset, p.LogStartOffset = res.BaseOffset, res.LogStartOffset
			waits = append(waits, pending{p, wait})
		}
	}

	finish := func(w pending) {
		if err := w.wait(); err != nil {
			setProduceError(w.p, err)
		}
	}
	// The waits start now rather than when the writer reaches this
	// response: the fsyncs of this request then overlap those of the
	// requests before it (on other partitions) and queue up for the group
	// commit on the same partitions, instead of running one after another.
	var wg sync.WaitGroup
	for _, w := range waits {
		wg.Go(func() { finish(w) })
	}
	wait := wg.Wait
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
}
