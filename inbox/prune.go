package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Prune forgets processed event ids that can no longer come back, given
// the group's committed offsets (topic -> partition -> offset): an id is
// deleted only when its record is below its partition's committed offset,
// so no member restarting from the committed offsets is handed it again,
// and it was processed more than RetainFor ago, so that a duplicate of the
// event published later (the relay's at-least-once window, bounded by the
// topic's retention) is still recognised. Partitions missing from
// committed keep every id. It returns how many ids it deleted.
func (c *Consumer) Prune(ctx context.Context, committed map[string]map[int32]int64) (int64, error) {
	var total int64
	for topic, parts := range committed {
		for p, offset := range parts {
			if offset <= 0 {
				continue
			}
			for {
				qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				tag, err := c.cfg.DB.Exec(qctx, c.sql.prune, c.cfg.Group, topic, p, offset, c.cfg.RetainFor)
				cancel()
				if err != nil {
					return total, fmt.Errorf("inbox: prune %s/%d: %w", topic, p, err)
				}
				total += tag.RowsAffected()
				if tag.RowsAffected() < 5000 {
					break
				}
			}
		}
	}
	c.cfg.Metrics.Pruned.WithLabelValues(c.cfg.Group).Add(float64(total))
	return total, nil
}

// CommittedOffsets reads the group's committed offsets from the cluster.
func CommittedOffsets(ctx context.Context, cl *kgo.Client, group string) (map[string]map[int32]int64, error) {
	resp, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	if err := resp.Error(); err != nil {
		return nil, err
	}
	out := map[string]map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err != nil || o.At < 0 {
			return
		}
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.At
	})
	return out, nil
}

// pruneLoop prunes every PruneInterval until ctx ends. A failure is
// logged once until a pass succeeds again, and counted.
func (c *Consumer) pruneLoop(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(c.cfg.PruneInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		committed, err := CommittedOffsets(fctx, cl, c.cfg.Group)
		cancel()
		if err == nil {
			_, err = c.Prune(ctx, committed)
		}
		if err != nil && ctx.Err() == nil {
			c.cfg.Metrics.PruneErrors.WithLabelValues(c.cfg.Group).Inc()
			if !failing {
				c.cfg.Logger.Warn("inbox: prune failed; processed ids are kept until a pass succeeds", "group", c.cfg.Group, "err", err)
			}
		}
		failing = err != nil
	}
}
