package protocol

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkShareVsClassicConsume consumes b.N records of one topic (four
// partitions, produced before the timer starts) with two members of a
// classic consumer group (offsets auto-committed) and with two members of
// a share group (every record acquired, accepted, and the acceptance
// saved), for a comparison within one run:
//
//	go test -run '^$' -bench ShareVsClassic -benchtime 200000x ./internal/broker/protocol/
func BenchmarkShareVsClassicConsume(b *testing.B) {
	for _, mode := range []string{"classic", "share"} {
		b.Run(mode, func(b *testing.B) {
			f := setup(b, nil)
			f.createTopic(b, "bench", 4)
			cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.DefaultProduceTopic("bench"))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			if mode == "share" {
				setShareConfigs(b, ctx, cl, "bench-share", "share.auto.offset.reset", "earliest")
			}
			value := make([]byte, 100)
			produceN(b, cl, func(i int) *kgo.Record { return &kgo.Record{Key: fmt.Appendf(nil, "%d", i), Value: value} }, 0, b.N)

			var got atomic.Int64
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var wg sync.WaitGroup
			start, cpu := startTimer(b, len(value))
			for range 2 {
				opts := []kgo.Opt{kgo.SeedBrokers(f.addr), kgo.ConsumeTopics("bench")}
				if mode == "share" {
					opts = append(opts, kgo.ShareGroup("bench-share"))
				} else {
					opts = append(opts, kgo.ConsumerGroup("bench-classic"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
				}
				m, err := kgo.NewClient(opts...)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					defer m.Close()
					for cctx.Err() == nil {
						fs := m.PollFetches(cctx)
						for _, r := range fs.Records() {
							if mode == "share" {
								r.Ack(kgo.AckAccept)
							}
						}
						if got.Add(int64(fs.NumRecords())) >= int64(b.N) {
							cancel()
						}
					}
				})
			}
			wg.Wait()
			reportRates(b, start, cpu)
		})
	}
}
