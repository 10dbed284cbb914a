package cdc

import (
	"fmt"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/outboxrelay/relay/relay"
)

func testEvent(i int) relay.Event {
	e := relay.Event{ID: int64(i + 1), EventID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), Topic: "t",
		Key: []byte(fmt.Sprint("k", i%3)), Payload: []byte(fmt.Sprint(i)),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, i, time.FixedZone("", 3600))}
	switch i % 4 {
	case 1:
		e.Key, e.Headers = nil, []byte(`{"a":"b"}`)
	case 2:
		e.Payload, e.ID = nil, -int64(i)
	case 3:
		e.Payload = []byte{}
	}
	return e
}

func payloads(t *testing.T, tx *streamTx) []relay.Event {
	t.Helper()
	var got []relay.Event
	if err := tx.each(func(e relay.Event) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// Events spilled and read back are the events kept, nil and empty slices
// told apart, and a subtransaction's abort cuts from its first event,
// whether that lies in memory or in the file, keeping what came before
// and what the parent adds after.
func TestStreamTxSpillAndSubAbort(t *testing.T) {
	dir := t.TempDir()
	tx := &streamTx{xid: 100}
	var want []relay.Event
	add := func(xid uint32, from, n int) {
		tx.seen(xid)
		for i := from; i < from+n; i++ {
			tx.add(testEvent(i))
		}
	}
	add(100, 0, 10)
	want = append(want, payloadsOf(0, 10)...)
	if _, err := tx.spill(dir); err != nil {
		t.Fatal(err)
	}
	add(101, 10, 5) // aborted, in the file after the next spill
	if _, err := tx.spill(dir); err != nil {
		t.Fatal(err)
	}
	add(102, 15, 5) // child of 101, in memory
	if _, err := tx.abortSub(102); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.abortSub(101); err != nil {
		t.Fatal(err)
	}
	add(100, 20, 5)
	want = append(want, payloadsOf(20, 5)...)
	add(103, 25, 5) // released: kept
	want = append(want, payloadsOf(25, 5)...)
	if _, err := tx.spill(dir); err != nil {
		t.Fatal(err)
	}
	add(104, 30, 3) // aborted while in memory
	if _, err := tx.abortSub(104); err != nil {
		t.Fatal(err)
	}
	add(100, 33, 2)
	want = append(want, payloadsOf(33, 2)...)
	if _, err := tx.abortSub(999); err != nil {
		t.Fatal(err)
	}
	got := payloads(t, tx)
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i].Key, want[i].Key) || !reflect.DeepEqual(got[i].Payload, want[i].Payload) ||
			!reflect.DeepEqual(got[i].Headers, want[i].Headers) || got[i].ID != want[i].ID || got[i].EventID != want[i].EventID ||
			!got[i].CreatedAt.Equal(want[i].CreatedAt) || got[i].Topic != want[i].Topic {
			t.Fatalf("event %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	path := tx.path
	tx.close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("spill file left after close: %v", err)
	}
}

func payloadsOf(from, n int) []relay.Event {
	var es []relay.Event
	for i := from; i < from+n; i++ {
		es = append(es, testEvent(i))
	}
	return es
}

// A torn spill file reads back as an error, not as fewer events.
func TestStreamTxTornFile(t *testing.T) {
	tx := &streamTx{xid: 7}
	for i := range 20 {
		tx.add(testEvent(i))
	}
	if _, err := tx.spill(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	defer tx.close()
	if err := tx.file.Truncate(tx.fileBytes - 3); err != nil {
		t.Fatal(err)
	}
	err := tx.each(func(relay.Event) error { return nil })
	if _, ok := err.(*spillError); !ok {
		t.Fatalf("reading a torn file: %v, want a spill error", err)
	}
}

// removeSpills removes only spill files.
func TestRemoveSpills(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{spillName(1), spillName(2), "other.txt"} {
		if err := os.WriteFile(dir+"/"+name, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := removeSpills(dir)
	if err != nil || n != 2 {
		t.Fatalf("removeSpills: %d, %v", n, err)
	}
	if _, err := os.Stat(dir + "/other.txt"); err != nil {
		t.Fatal(err)
	}
	if n, err := removeSpills(dir + "/missing"); err != nil || n != 0 {
		t.Fatalf("missing directory: %d, %v", n, err)
	}
}

// Protocol version 2 with streaming is asked of PostgreSQL 14 and later
// only.
func TestServerMajor(t *testing.T) {
	for v, want := range map[string]int{"15.18 (Debian 15.18-0+deb12u1)": 15, "14beta1": 14, "13.9": 13, "9.6.24": 9, "devel": 0, "": 0} {
		if got := serverMajor(v); got != want {
			t.Errorf("serverMajor(%q) = %d, want %d", v, got, want)
		}
	}
}
