package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DeadLetter is a record the consumer gave up on, or held behind one.
type DeadLetter struct {
	ID        int64
	Group     string
	EventID   string
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kgo.RecordHeader
	// RecordTime is the record's timestamp.
	RecordTime time.Time
	Attempts   int
	Reason     string
	// Held is true for a record that did not fail but waits behind an
	// earlier dead letter of its key (Policy HoldKey).
	Held      bool
	CreatedAt time.Time
}

// Record is the dead letter as the record it was.
func (d DeadLetter) Record() *kgo.Record {
	return &kgo.Record{Topic: d.Topic, Partition: d.Partition, Offset: d.Offset, Key: d.Key, Value: d.Value, Headers: d.Headers, Timestamp: d.RecordTime}
}

type header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

func insertDeadLetter(ctx context.Context, tx pgx.Tx, sql statements, group, id string, r *kgo.Record, attempts int, reason string, held bool) error {
	hs := make([]header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = header{h.Key, h.Value}
	}
	headers, err := json.Marshal(hs)
	if err != nil {
		return err
	}
	var ts *time.Time
	if !r.Timestamp.IsZero() {
		ts = &r.Timestamp
	}
	_, err = tx.Exec(ctx, sql.insertDead, group, id, r.Topic, r.Partition, r.Offset, r.Key, r.Value, headers, ts, attempts, reason, held)
	return err
}

func scanDeadLetter(row pgx.Row) (DeadLetter, error) {
	var (
		d       DeadLetter
		headers []byte
		ts      *time.Time
	)
	if err := row.Scan(&d.ID, &d.Group, &d.EventID, &d.Topic, &d.Partition, &d.Offset, &d.Key, &d.Value, &headers, &ts, &d.Attempts, &d.Reason, &d.Held, &d.CreatedAt); err != nil {
		return d, err
	}
	var hs []header
	if err := json.Unmarshal(headers, &hs); err != nil {
		return d, fmt.Errorf("inbox: dead letter %d: headers: %w", d.ID, err)
	}
	for _, h := range hs {
		d.Headers = append(d.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if ts != nil {
		d.RecordTime = *ts
	}
	return d, nil
}

// DeadLetters lists up to limit of the group's dead letters (limit <= 0:
// 1,000), by topic, partition and offset.
func (c *Consumer) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := c.cfg.DB.Query(ctx, c.sql.listDead, c.cfg.Group, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDeadLetter(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// ErrNotFirst is returned by Retry for a dead letter with an earlier dead
// letter of the same key and partition: retrying it first would break the
// key's order.
var ErrNotFirst = errors.New("inbox: an earlier dead letter of the same key must be retried or discarded first")

// Retry runs the handler on dead letter id now, in a transaction that also
// removes the dead letter: the record is applied once, or stays dead (the
// handler's error is returned). Dead letters of one key are retried in
// offset order (ErrNotFirst).
func (c *Consumer) Retry(ctx context.Context, id int64) error {
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: retry: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	d, err := c.lockFirst(ctx, tx, id)
	if err != nil {
		return err
	}
	r := d.Record()
	ctx, end := c.startSpan(ctx, r, d.EventID)
	err = c.cfg.Handler(ctx, tx, r)
	end(err)
	if err != nil {
		return fmt.Errorf("inbox: retry of dead letter %d: %w", id, err)
	}
	if _, err := tx.Exec(ctx, c.sql.deleteDead, c.cfg.Group, id); err != nil {
		return fmt.Errorf("inbox: retry: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: retry: %w", err)
	}
	c.cfg.Metrics.Applied.WithLabelValues(c.cfg.Group, d.Topic).Inc()
	return nil
}

// Discard removes dead letter id without applying it. Its event id stays
// processed, so a redelivery is skipped.
func (c *Consumer) Discard(ctx context.Context, id int64) error {
	tag, err := c.cfg.DB.Exec(ctx, c.sql.deleteDead, c.cfg.Group, id)
	if err != nil {
		return fmt.Errorf("inbox: discard: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("inbox: no dead letter %d in group %s", id, c.cfg.Group)
	}
	return nil
}

func (c *Consumer) lockFirst(ctx context.Context, tx pgx.Tx, id int64) (DeadLetter, error) {
	d, err := scanDeadLetter(tx.QueryRow(ctx, c.sql.lockDead, c.cfg.Group, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("inbox: no dead letter %d in group %s", id, c.cfg.Group)
	}
	if err != nil {
		return d, fmt.Errorf("inbox: dead letter %d: %w", id, err)
	}
	if d.Key != nil {
		var earlier int64
		err := tx.QueryRow(ctx, c.sql.earlierDead, c.cfg.Group, d.Topic, d.Key, d.Partition, d.Offset).Scan(&earlier)
		if err == nil {
			return d, fmt.Errorf("%w (dead letter %d)", ErrNotFirst, earlier)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return d, fmt.Errorf("inbox: dead letter %d: %w", id, err)
		}
	}
	return d, nil
}
