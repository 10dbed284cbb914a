package cdc

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// chunky returns at most n bytes per Read, as a socket holding a few
// messages does.
type chunky struct {
	r io.Reader
	n int
}

func (c chunky) Read(b []byte) (int, error) { return c.r.Read(b[:min(len(b), c.n)]) }

// Inside a large transaction a read that found little makes the next one
// wait bulkPause; outside one, and after a read of pauseBelow or more,
// the data read is the same and in order either way.
func TestPacerWaitsAfterShortReadsInBulk(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<14) // 256 KiB
	read := func(p *pacer, size int) ([]byte, time.Duration) {
		t.Helper()
		p.r = chunky{bytes.NewReader(data), size}
		start := time.Now()
		got, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		return got, time.Since(start)
	}

	const reads = 20
	bulk := &pacer{}
	bulk.setBulk(true)
	got, took := read(bulk, len(data)/reads)
	if !bytes.Equal(got, data) {
		t.Fatal("bulk reads changed the data")
	}
	// Every read after the first found less than pauseBelow.
	if want := (reads - 1) * bulkPause; took < want {
		t.Fatalf("%d short reads in bulk took %v, want at least %v", reads, took, want)
	}

	for _, p := range []*pacer{{}, bulk} {
		p.setBulk(p != bulk)
		if got, _ := read(p, pauseBelow); !bytes.Equal(got, data) {
			t.Fatal("reads changed the data")
		}
	}
	var none *pacer
	none.setBulk(true) // a reader without a session has no pacer
}
