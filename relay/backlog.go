package relay

import (
	"context"
	"time"
)

// backlogSampler returns the backlog service's pass: it sets the backlog
// gauge, the publish rate and the drain estimate. The count is exact up
// to 100,000 rows and the planner's estimate beyond that, so a large
// backlog does not cost a full scan every few seconds (store.Backlog). A
// failed pass leaves the gauges as they were (maintenance.go says how
// that shows).
// begin, called at each start of the service, makes the rate count from
// then.
func (r *Relay) backlogSampler() (pass func(context.Context) error, begin func()) {
	var rate float64
	var lastCount int64
	var lastAt time.Time
	// Each sample weighs so that the rate reflects about the last minute.
	weight := min(1, r.cfg.BacklogInterval.Seconds()/60)
	begin = func() { lastCount, lastAt, rate = r.published.Load(), time.Now(), 0 }
	return func(ctx context.Context) error {
		n, err := r.store.Backlog(ctx, r.pool)
		if err != nil {
			return err
		}
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
		return nil
	}, begin
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
