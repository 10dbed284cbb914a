// Package idlemem gives an idle relay's memory back to the operating
// system.
//
// The relay collects garbage at 400% heap growth while it works (cli's
// tuneGC): a drain's live heap of 15-25 MiB then grows to 75-125 MiB
// between collections, and an idle relay allocates so little (about
// 100 KiB/s: polls, metrics, a group's fetches) that it stays there for
// many minutes, sync.Pool's buffers included, since those are dropped only
// by collections. Watch samples the bytes allocated every interval; when
// an interval allocated less than Config.IdleBytes the process is idle:
// Watch lowers the collector's growth to Config.IdlePercent, collects
// twice (the second collection drops what the pools' victim caches held)
// and returns the freed memory to the operating system. While idle it
// does so again whenever the heap grew by another Config.RegrowBytes,
// and the first busy interval restores Config.BusyPercent.
//
// Nothing here changes what the relay does, only when its garbage is
// collected; a collection costs a few milliseconds of CPU over a heap of
// this size, once per idle period or per RegrowBytes allocated while idle.
package idlemem

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Config tunes Watch. Zero fields take the defaults.
type Config struct {
	// Interval is how often the allocation counter is sampled (default
	// 5 s).
	Interval time.Duration
	// IdleBytes: an interval that allocated fewer bytes is idle (default
	// 1 MiB).
	IdleBytes uint64
	// RegrowBytes: while idle, memory is returned again once the heap
	// holds this much more than after the last return (default 4 MiB).
	RegrowBytes uint64
	// BusyPercent and IdlePercent are the collector's growth (GOGC)
	// while busy and while idle; KeepPercent leaves it alone (GOGC set in
	// the environment).
	BusyPercent, IdlePercent int
	KeepPercent              bool
	// Trimmed, when set, is called after each return of memory with the
	// heap's bytes then (for tests and logs).
	Trimmed func(heapBytes uint64)
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.IdleBytes == 0 {
		c.IdleBytes = 1 << 20
	}
	if c.RegrowBytes == 0 {
		c.RegrowBytes = 4 << 20
	}
	if c.BusyPercent == 0 {
		c.BusyPercent = 400
	}
	if c.IdlePercent == 0 {
		c.IdlePercent = 100
	}
	return c
}

const (
	allocsMetric = "/gc/heap/allocs:bytes"
	heapMetric   = "/memory/classes/heap/objects:bytes"
)

// Watch runs until ctx ends, returning memory whenever the process idles.
// When it returns, the collector's growth is BusyPercent again (unless
// KeepPercent).
func Watch(ctx context.Context, cfg Config) {
	cfg = cfg.withDefaults()
	samples := []metrics.Sample{{Name: allocsMetric}, {Name: heapMetric}}
	read := func() (allocs, heap uint64) {
		metrics.Read(samples)
		return samples[0].Value.Uint64(), samples[1].Value.Uint64()
	}
	last, _ := read()
	idle := false
	var trimmedAt uint64
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	defer func() {
		if idle && !cfg.KeepPercent {
			debug.SetGCPercent(cfg.BusyPercent)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		allocs, heap := read()
		quiet := allocs-last < cfg.IdleBytes
		last = allocs
		switch {
		case quiet && !idle:
			idle = true
			if !cfg.KeepPercent {
				debug.SetGCPercent(cfg.IdlePercent)
			}
			trimmedAt = trim(cfg)
		case quiet && heap > trimmedAt+cfg.RegrowBytes:
			trimmedAt = trim(cfg)
		case !quiet && idle:
			idle = false
			if !cfg.KeepPercent {
				debug.SetGCPercent(cfg.BusyPercent)
			}
		}
	}
}

// trim collects twice, returns the free memory and reports the heap left.
func trim(cfg Config) uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	heap := s[0].Value.Uint64()
	if cfg.Trimmed != nil {
		cfg.Trimmed(heap)
	}
	return heap
}
