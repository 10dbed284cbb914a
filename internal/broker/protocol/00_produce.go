package protocol

import (
	"context"
	"sync"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleProduce appends each partition's record batch as sent (compressed
// batches are stored as they are). Partitions of one request are appended
// concurrently so their fsyncs overlap; the response waits for all of them,
// so with acks=1 and acks=-1 alike a success means durable under the
// broker's sync policy. acks=0 gets no response.
func (s *Server) handleProduce(ctx context.Context, req *kmsg.ProduceRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	var code int16
	switch {
	case req.TransactionID != nil:
		code = kerr.InvalidRequest.Code
	case req.Acks != 0 && req.Acks != 1 && req.Acks != -1:
		code = kerr.InvalidRequiredAcks.Code
	}

	type job struct {
		topic, part int
		records     []byte
	}
	var jobs []job
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
			jobs = append(jobs, job{i, j, rp.Records})
		}
	}

	run := func(j job) {
		p := &resp.Topics[j.topic].Partitions[j.part]
		res, err := s.b.Append(ctx, resp.Topics[j.topic].Topic, p.Partition, j.records)
		if err != nil {
			p.ErrorCode = broker.KafkaErrorCode(err)
			msg := err.Error()
			p.ErrorMessage = &msg
			return
		}
		p.BaseOffset, p.LogStartOffset = res.BaseOffset, res.LogStartOffset
	}
	switch len(jobs) {
	case 0:
	case 1:
		run(jobs[0])
	default:
		var wg sync.WaitGroup
		for _, j := range jobs[1:] {
			wg.Go(func() { run(j) })
		}
		run(jobs[0])
		wg.Wait()
	}
	if req.Acks == 0 {
		return nil
	}
	return resp
}
