package relay

import (
	"context"
	"time"
)

// sampleBacklog keeps the backlog gauge current while ctx lasts. It counts
// exactly up to 100,000 rows and uses the planner's estimate beyond that,
// so a large backlog does not cost a full scan every few seconds.
func (r *Relay) sampleBacklog(ctx context.Context) {
	t := time.NewTicker(r.cfg.BacklogInterval)
	defer t.Stop()
	var rate float64
	lastCount, lastAt := r.published.Load(), time.Now()
	// Each sample weighs so that the rate reflects about the last minute.
	weight := min(1, r.cfg.BacklogInterval.Seconds()/60)
	for {
		if n, err := r.store.Backlog(ctx, r.pool); err == nil {
			r.m.Backlog.Set(float64(n))
			count, now := r.published.Load(), time.Now()
			if dt := now.Sub(lastAt).Seconds(); dt > 0 && count >= lastCount {
				sample := float64(count-lastCount) / dt
				if rate == 0 {
					rate = sample
				} else {
					rate += weight * (sample - rate)
				}
			}
			lastCount, lastAt = count, now
			r.m.PublishRate.Set(rate)
			r.m.DrainETA.Set(drainETA(n, rate))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drainETA is the seconds a backlog of n rows takes at rate events/s: 0
// when empty, -1 when nothing is being published.
func drainETA(n int64, rate float64) float64 {
	switch {
	case n == 0:
		return 0
	case rate < 0.001:
		return -1
	}
	return float64(n) / rate
}
