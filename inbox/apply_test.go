package inbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestInboxConcurrentApplyOnce hands the same 200 records of a partition
// to two consumers of one group at once, as after a rebalance whose
// previous owner still applies what it fetched (paused past its session
// timeout): every record is applied once, and in offset order.
func TestInboxConcurrentApplyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := Migrate(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE applied (id bigserial PRIMARY KEY, member int, "offset" bigint)`); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := 0; i < 200; i++ {
		recs = append(recs, &kgo.Record{Topic: "t", Partition: 3, Offset: int64(i), Key: []byte("k"),
			Headers: []kgo.RecordHeader{{Key: EventIDHeader, Value: []byte(fmt.Sprintf("e%d", i))}}})
	}
	member := func(m, batch int) *Consumer {
		c, err := New(Config{DB: db, Group: "g", Topics: []string{"t"}, BatchSize: batch,
			Handler: func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
				_, err := tx.Exec(ctx, `INSERT INTO applied (member, "offset") VALUES ($1, $2)`, m, r.Offset)
				return err
			}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var wg sync.WaitGroup
	for m, batch := range []int{1, 7} {
		c := member(m, batch)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if last, stuck := c.applyPartition(ctx, recs); stuck != nil || last != recs[len(recs)-1] {
				t.Errorf("member %d: last %v, stuck at %v", m, last, stuck)
			}
		}()
	}
	wg.Wait()
	rows, err := db.Query(ctx, `SELECT member, "offset" FROM applied ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ Member, Offset int64 }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("%d applications of %d records", len(got), len(recs))
	}
	by := map[int64]int{}
	for i, r := range got {
		if r.Offset != int64(i) {
			t.Fatalf("application %d is offset %d: out of order", i, r.Offset)
		}
		by[r.Member]++
	}
	t.Logf("applications by member: %v", by)
}
