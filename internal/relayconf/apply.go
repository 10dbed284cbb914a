package relayconf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/outboxrelay/relay/internal/broker"
)

// Apply makes the broker's topics what the file declares, all or
// nothing: every declared topic is checked first, and a refusal changes
// nothing. A missing topic is created with its declared configs over
// topic-defaults; an existing one gets its declared configs, the rest
// from topic-defaults (a change made through AlterConfigs to a declared
// topic lasts until the next Apply). A declared partition count above the
// current one that moves keys is a migration: refused, with the report of
// the keys it would move, unless allowRepartition (the allow-repartition
// setting) or the topic's own allow-repartition confirms it; one that
// moves none of the keys in the log is made. A lower count is always
// refused. Topics the file does not declare keep their configuration;
// topic-defaults applies to those created from now on. The janitor then
// runs a pass, so a shorter retention takes effect at once.
func (f *File) Apply(ctx context.Context, b *broker.Broker, allowRepartition bool, log *slog.Logger) error {
	fail := func(line int, format string, args ...any) error {
		return &Error{Path: f.Path, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	type step struct {
		t      Topic
		exists bool
		grow   bool
		// confirmed: the increase may move keys; otherwise it is made
		// only if it still moves none.
		confirmed bool
	}
	var plan []step
	for _, t := range f.Topics {
		ti, err := b.Topic(t.Name)
		if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
			plan = append(plan, step{t: t})
			continue
		}
		if err != nil {
			return fail(t.Line, "topic %s: %v", t.Name, err)
		}
		have := int32(len(ti.Partitions))
		s := step{t: t, exists: true}
		switch want := t.Config.Partitions; {
		case want == 0 || want == have:
		case want < have:
			return fail(t.PartitionsLine, "topic %s has %d partitions; a partition count is never lowered", t.Name, have)
		default:
			report, err := b.KeyMovement(ctx, t.Name, want)
			if err != nil {
				return fail(t.PartitionsLine, "topic %s: %v", t.Name, err)
			}
			s.confirmed = allowRepartition || t.AllowRepartition
			if !s.confirmed && report.Moving > 0 {
				return fail(t.PartitionsLine, "%s: a partition increase that moves keys is a migration, refused unless confirmed by allow-repartition: true on the topic (or --allow-repartition); see docs/topics.md", report)
			}
			log.Warn("raising a declared topic's partition count", "topic", t.Name, "from", have, "to", want,
				"keys", report.Keys, "keys_moved", report.Moving)
			s.grow = true
		}
		plan = append(plan, s)
	}
	if err := b.SetDefaultTopicConfig(f.Defaults); err != nil {
		return fail(0, "%s: %v", SectionDefaults, err)
	}
	for _, s := range plan {
		t := s.t
		// Zero fields take topic-defaults, now the broker's defaults.
		cfg := t.Config
		if !s.exists {
			if _, err := b.CreateTopic(t.Name, cfg); err != nil {
				return fail(t.Line, "creating topic %s: %v", t.Name, err)
			}
			log.Info("created declared topic", "topic", t.Name)
			continue
		}
		if s.grow && s.confirmed {
			if _, err := b.AddPartitions(t.Name, cfg.Partitions); err != nil {
				return fail(t.PartitionsLine, "topic %s: %v", t.Name, err)
			}
		} else if s.grow {
			if _, err := b.AddPartitionsMovingNoKey(ctx, t.Name, cfg.Partitions); err != nil {
				return fail(t.PartitionsLine, "topic %s: %v", t.Name, err)
			}
		}
		cfg.Partitions = 0
		before, _ := b.Topic(t.Name)
		after, err := b.AlterTopicConfig(t.Name, cfg)
		if err != nil {
			return fail(t.Line, "topic %s: %v", t.Name, err)
		}
		if before.Config != after.Config {
			log.Info("applied declared topic configs", "topic", t.Name, "retention_ms", after.Config.RetentionMs,
				"retention_bytes", after.Config.RetentionBytes, "cleanup_policy", after.Config.CleanupPolicy)
		}
	}
	b.KickJanitor()
	return nil
}
