package store_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/relay/store"
)

func TestPollMessageLimit(t *testing.T) {
	f := setup(t)
	p := store.NewPollReader(schema, 20)
	ids := f.int64s(`INSERT INTO `+schema+`.events (topic, key, payload, headers) VALUES
    ('t', 'k', 'small', NULL),
    ('t', 'k', $1, '{"a": "b"}'),
    ('t', $2, 'x', NULL)
RETURNING id`, []byte(strings.Repeat("z", 30)), strings.Repeat("z", 30))
	rs := rowsOf(t, func(each func(store.PageRow) bool) error {
		return p.ReadFresh(f.ctx, f.conn, false, nil, 10, 1, 0, each)
	})
	if !slices.Equal(rowIDs(rs), ids) {
		t.Fatalf("read %v, want %v", rowIDs(rs), ids)
	}
	if r := rs[0]; r.Size != 6 || string(r.Payload) != "small" || r.Headers != nil || *r.Key != "k" {
		t.Fatalf("a row within the limit %+v", r)
	}
	// Above the limit: no payload or headers; the key comes when it alone
	// fits.
	if r := rs[1]; r.Size != 1+30+10 || r.Payload != nil || r.Headers != nil || r.Key == nil || *r.Key != "k" {
		t.Fatalf("a row above the limit %+v", r)
	}
	if r := rs[2]; r.Size != 31 || r.Payload != nil || r.Key != nil {
		t.Fatalf("a row whose key is above the limit %+v", r)
	}
	var fetched []store.PageRow
	if err := p.Fetch(f.ctx, f.conn, []int64{ids[2], 999, ids[1]}, func(r store.PageRow) { fetched = append(fetched, r) }); err != nil {
		t.Fatal(err)
	}
	if len(fetched) != 2 || fetched[0].Payload != nil || fetched[1].Payload != nil {
		t.Fatalf("fetched %+v: want the two rows, without their content", fetched)
	}
}

func TestPollIDPages(t *testing.T) {
	f := setup(t)
	p := store.NewPollReader(schema, 1000)
	old := f.events(2, "t", nil)
	var snap0 string
	f.conn.QueryRow(f.ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap0)
	batch := f.events(5, "t", nil)
	var snap1 string
	f.conn.QueryRow(f.ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap1)
	f.events(2, "t", nil) // after snap1: in no page of this batch
	page := func(first bool, prev *string, after int64, limit int) []int64 {
		return rowIDs(rowsOf(t, func(each func(store.PageRow) bool) error {
			return p.ReadIDPage(f.ctx, f.conn, first, prev, snap1, after, limit, each)
		}))
	}
	for _, c := range []struct {
		name  string
		first bool
		prev  *string
		after int64
		limit int
		want  []int64
	}{
		{"first page of a delta", true, &snap0, 0, 3, batch[:3]},
		{"next page scans from the cursor", false, &snap0, batch[2], 3, batch[3:]},
		{"whole snapshot without prev", false, nil, 0, 100, append(append([]int64{}, old...), batch...)},
		{"a scan with prev leaves out what prev saw", false, &snap0, 0, 100, batch},
		{"after the last", false, &snap0, batch[4], 10, []int64{}},
	} {
		if got := page(c.first, c.prev, c.after, c.limit); !slices.Equal(got, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPollCommitTimestampReads(t *testing.T) {
	f := setupCommitTS(t)
	p := store.NewPollReader(schema, 1000)
	var snap0 string
	f.conn.QueryRow(f.ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap0)
	// Transaction A inserts first and commits last: in commit order its
	// row comes after B's.
	a, b := pgtestConn(f), pgtestConn(f)
	atx, _ := a.Begin(f.ctx)
	var aID, bID int64
	atx.QueryRow(f.ctx, `INSERT INTO `+schema+`.events (topic) VALUES ('a') RETURNING id`).Scan(&aID)
	b.QueryRow(f.ctx, `INSERT INTO `+schema+`.events (topic) VALUES ('b') RETURNING id`).Scan(&bID)
	if err := atx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	cIDs := f.events(2, "c", nil)
	want := append([]int64{bID, aID}, cIDs...)
	var snap1 string
	f.conn.QueryRow(f.ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap1)

	rs := rowsOf(t, func(each func(store.PageRow) bool) error {
		return p.ReadFresh(f.ctx, f.conn, true, &snap0, 10, 1, 0, each)
	})
	if !slices.Equal(rowIDs(rs), want) || rs[0].Snapshot == nil || rs[0].CommitKey <= 0 || rs[0].Txid == "" {
		t.Fatalf("fresh read by commit timestamp %v (%+v), want %v", rowIDs(rs), rs[0], want)
	}
	if ticks, _ := p.LoadTicks(f.ctx, f.conn, 0); len(ticks) != 1 || !ticks[0].ByTS {
		t.Fatalf("tick of a read by commit timestamp %+v", ticks)
	}
	first := rowsOf(t, func(each func(store.PageRow) bool) error {
		return p.ReadFirstTSPage(f.ctx, f.conn, &snap0, snap1, 2, each)
	})
	if !slices.Equal(rowIDs(first), want[:2]) {
		t.Fatalf("first page %v, want %v", rowIDs(first), want[:2])
	}
	// The listing goes on after the first page's last row, in the same
	// order, with the sizes.
	last := first[1]
	for _, prev := range []*string{&snap0, nil} {
		ids, sizes, err := p.ListTS(f.ctx, f.conn, prev, snap1, last.CommitKey, last.Txid, last.ID)
		if err != nil || !slices.Equal(ids, want[2:]) || len(sizes) != 2 || sizes[0] != 12 {
			t.Fatalf("listing after %d (prev %v): %v %v, %v; want %v", last.ID, prev != nil, ids, sizes, err, want[2:])
		}
	}
	ids, _, err := p.ListTS(f.ctx, f.conn, &snap0, snap1, -9223372036854775808, "0", 0)
	if err != nil || !slices.Equal(ids, want) {
		t.Fatalf("listing from the start %v, %v; want %v", ids, err, want)
	}
}
