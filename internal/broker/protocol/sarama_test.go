package protocol

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

func saramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.ClientID = "sarama-test"
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	return cfg
}

func TestSaramaProduceConsume(t *testing.T) {
	t.Parallel()
	const topic, parts, perPart = "sarama", 3, 50
	f, ctx := setupTopic(t, topic, parts, 60*time.Second)
	cfg := saramaConfig()

	prod, err := sarama.NewSyncProducer([]string{f.addr}, cfg)
	if err != nil {
		t.Fatalf("sarama producer: %v", err)
	}
	for p := range int32(parts) {
		for i := range perPart {
			msg := &sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.StringEncoder(fmt.Sprintf("p%d-%d", p, i)), Value: sarama.StringEncoder(fmt.Sprintf("v%d-%d", p, i))}
			gotP, off, err := prod.SendMessage(msg)
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			if gotP != p || off != int64(i) {
				t.Fatalf("message landed at %d/%d, want %d/%d", gotP, off, p, i)
			}
		}
	}
	if err := prod.Close(); err != nil {
		t.Fatalf("close producer: %v", err)
	}

	cons, err := sarama.NewConsumer([]string{f.addr}, cfg)
	if err != nil {
		t.Fatalf("sarama consumer: %v", err)
	}
	defer cons.Close()
	for p := range int32(parts) {
		pc, err := cons.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("consume partition %d: %v", p, err)
		}
		for i := range perPart {
			select {
			case m := <-pc.Messages():
				if want := fmt.Sprintf("p%d-%d", p, i); string(m.Key) != want || m.Offset != int64(i) {
					t.Fatalf("got %s@%d, want %s@%d", m.Key, m.Offset, want, i)
				}
			case err := <-pc.Errors():
				t.Fatalf("partition consumer: %v", err)
			case <-ctx.Done():
				t.Fatalf("partition %d: consumed %d of %d", p, i, perPart)
			}
		}
		if err := pc.Close(); err != nil {
			t.Fatalf("close partition consumer: %v", err)
		}
	}

	// A consumer group reads everything and commits it.
	group, err := sarama.NewConsumerGroup([]string{f.addr}, "sarama-group", cfg)
	if err != nil {
		t.Fatalf("consumer group: %v", err)
	}
	h := &saramaHandler{want: parts * perPart, done: make(chan struct{})}
	gctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() {
		for gctx.Err() == nil {
			if err := group.Consume(gctx, []string{topic}, h); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	select {
	case <-h.done:
	case <-ctx.Done():
		t.Fatalf("group consumed %d of %d", h.count(), parts*perPart)
	}
	cancel()
	if err := <-errs; err != nil {
		t.Fatalf("group consume: %v", err)
	}
	if err := group.Close(); err != nil {
		t.Fatalf("close group: %v", err)
	}
	for p := range int32(parts) {
		if c, ok := f.b.FetchOffset("sarama-group", topic, p); !ok || c.Offset != perPart {
			t.Errorf("partition %d committed %+v ok=%v, want %d", p, c, ok, perPart)
		}
	}
}

type saramaHandler struct {
	want int
	mu   sync.Mutex
	seen map[string]bool
	done chan struct{}
}

func (h *saramaHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seen)
}

func (h *saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *saramaHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		sess.MarkMessage(m, "")
		h.mu.Lock()
		if h.seen == nil {
			h.seen = map[string]bool{}
		}
		h.seen[string(m.Key)] = true
		if len(h.seen) == h.want {
			sess.Commit()
			select {
			case <-h.done:
			default:
				close(h.done)
			}
		}
		h.mu.Unlock()
	}
	return nil
}
