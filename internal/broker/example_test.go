package broker_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
)

// A relay-style producer with a stable identity appends, restarts, learns
// where its sequence left off, and has a retried batch recognised.
func Example() {
	dir, err := os.MkdirTemp("", "broker-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	b, err := broker.Open(ctx, broker.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := b.CreateTopic("orders", broker.TopicConfig{Partitions: 3}); err != nil {
		log.Fatal(err)
	}
	pid, err := b.InitProducerID(ctx, "relay-outbox")
	if err != nil {
		log.Fatal(err)
	}
	key := []byte("order-42")
	part := broker.PartitionForKey(key, 3)
	batch := broker.EncodeBatch(pid.ID, pid.Epoch, 0, []broker.Record{
		{Key: key, Value: []byte(`{"status":"paid"}`), Timestamp: time.UnixMilli(0)},
	})
	retry := append([]byte(nil), batch...)
	res, err := b.Append(ctx, "orders", part, batch)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("appended at", res.BaseOffset)
	if err := b.Close(); err != nil {
		log.Fatal(err)
	}

	b, err = broker.Open(ctx, broker.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	st, _, err := b.ProducerState("orders", part, pid.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("last sequence", st.LastSequence())
	res, err = b.Append(ctx, "orders", part, retry)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry duplicate:", res.Duplicate, "offset", res.BaseOffset)
	f, err := b.Fetch(ctx, "orders", part, 0, 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	for r, err := range broker.ReadRecords(f.Batches) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d %s %s\n", r.Offset, r.Key, r.Value)
	}
	// Output:
	// appended at 0
	// last sequence 0
	// retry duplicate: true offset 0
	// 0 order-42 {"status":"paid"}
}
