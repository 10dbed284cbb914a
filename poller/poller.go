// Package poller reads the outbox with plain SQL: the polling reader.
//
// # Approach: the snapshot horizon
//
// An outbox row's ordering id is assigned at INSERT but becomes visible at
// COMMIT, so a reader that keeps a cursor "id > last seen" skips a row whose
// transaction took a low id and committed late. Instead every row records
// the id of the transaction that wrote it (txid, an xid8 filled by
// pg_current_xact_id()), and the poller reads only rows whose transaction
// is older than the oldest transaction still running:
//
//	WHERE txid < pg_snapshot_xmin(pg_current_snapshot())
//	  AND (txid, id) > cursor
//	ORDER BY txid, id
//
// Every transaction below that horizon has finished, so no row can appear
// later behind the cursor: nothing is skipped. Ordering by (txid, id) keeps
// the order guarantee: if T1 committed before T2 began, T2 got its
// transaction id after T1 had one, so T1's rows come first; within a
// transaction rows keep their insert order.
//
// Costs, stated plainly:
//   - A long-running transaction anywhere in the cluster (even one that
//     writes no events) holds the horizon back: events committed after it
//     started wait until it ends. Keep transactions short, or use the WAL
//     reader (cdc/), which has no such wait.
//   - Transaction ids do not survive a dump and restore into a new cluster;
//     drain the outbox before moving it.
//   - Each row costs a DELETE after publication (done by the core in
//     batches), which is the price of the table staying small.
//
// # Wake-up
//
// An AFTER INSERT statement trigger sends NOTIFY on the channel
// "<schema>.events" at commit. The poller LISTENs on its own connection and
// queries as soon as a notification arrives; it also queries every
// PollInterval, because notifications are lost while it is disconnected.
// When rows exist beyond the cursor but are not yet below the horizon (an
// older transaction is still open), it retries after a short, growing delay
// instead of waiting for the next notification.
//
// The poller never deletes rows: the core does, after the sink has made the
// events durable, in the transaction that saves the checkpoint. The cursor
// lives in memory; after a restart the core passes the checkpoint position
// to Start, and the rows still in the table are exactly the events not yet
// acknowledged.
package poller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
)

// Config configures a Poller. The zero value of every field but
// DatabaseURL takes a default.
type Config struct {
	// DatabaseURL is the connection string; empty means the PG* variables.
	DatabaseURL string
	// Schema holds the outbox table (default "outbox").
	Schema string
	// PollInterval is how often the poller queries without a notification
	// (default 1s).
	PollInterval time.Duration
	// Logger receives the poller's logs (default: slog.Default()).
	Logger *slog.Logger
}

// WithDefaults returns c with its unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c after defaults are applied.
func (c Config) Validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	if _, err := pgconfig.ParseConfig(c.DatabaseURL); err != nil {
		return err
	}
	return nil
}

// Poller is a relay.Source that reads the outbox table with SQL.
type Poller struct {
	cfg     Config
	query   string
	pending string
	channel string

	conn   *pgx.Conn
	listen *pgx.Conn
	cursor relay.Position
	// backoff is the current delay while rows wait behind the horizon.
	backoff time.Duration
	// acked is signalled by Acked. The core's acknowledgement transaction
	// holds the horizon while it runs and sends no notification when it
	// commits, so its end is a reason to look again.
	acked chan struct{}
}

var _ relay.Source = (*Poller)(nil)

// New returns a Poller; it connects in Start.
func New(cfg Config) (*Poller, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	table := pgx.Identifier{cfg.Schema, "events"}.Sanitize()
	return &Poller{
		cfg: cfg,
		// The text rendering of txid gets its own name: ORDER BY must sort
		// by the xid8 column, not by its text.
		query: `SELECT e.id, e.txid::text AS txid_text, e.event_id::text, e.topic, e.key, e.payload, e.headers::text, e.created_at
FROM ` + table + ` AS e
WHERE e.txid < pg_snapshot_xmin(pg_current_snapshot()) AND (e.txid, e.id) > ($1::text::xid8, $2)
ORDER BY e.txid, e.id
LIMIT $3`,
		acked:   make(chan struct{}, 1),
		pending: `SELECT EXISTS (SELECT 1 FROM ` + table + ` WHERE (txid, id) > ($1::text::xid8, $2))`,
		channel: cfg.Schema + ".events",
	}, nil
}

// Start connects, listens for commits and sets the cursor to from.
func (p *Poller) Start(ctx context.Context, from relay.Position) error {
	p.Close(ctx)
	conn, err := pgconfig.Connect(ctx, p.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	// Waits on this connection time out often; a deadline, not the default
	// cancel request (a new connection to the server each time), ends them.
	listen, err := pgconfig.ConnectWith(ctx, p.cfg.DatabaseURL, func(c *pgx.ConnConfig) {
		c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
		}
	})
	if err != nil {
		conn.Close(ctx)
		return err
	}
	if _, err := listen.Exec(ctx, "LISTEN "+pgx.Identifier{p.channel}.Sanitize()); err != nil {
		conn.Close(ctx)
		listen.Close(ctx)
		return fmt.Errorf("poller: LISTEN: %w", err)
	}
	p.conn, p.listen, p.cursor, p.backoff = conn, listen, from, 0
	return nil
}

// Next returns up to max events after the cursor, waiting for a commit
// when there are none.
func (p *Poller) Next(ctx context.Context, max int) ([]relay.Event, error) {
	if p.conn == nil {
		return nil, errors.New("poller: Next before Start")
	}
	for {
		events, err := p.read(ctx, max)
		if err != nil || len(events) > 0 {
			p.backoff = 0
			return events, err
		}
		if err := p.wait(ctx); err != nil {
			return nil, err
		}
	}
}

func (p *Poller) read(ctx context.Context, max int) ([]relay.Event, error) {
	rows, err := p.conn.Query(ctx, p.query, strconv.FormatUint(p.cursor.Major, 10), int64(p.cursor.Minor), max)
	if err != nil {
		return nil, fmt.Errorf("poller: reading events: %w", err)
	}
	// Sized by what arrives, not by max: under a steady load most reads
	// return a few rows, and a max-sized slice each time fed the GC.
	var events []relay.Event
	var txid string
	for rows.Next() {
		var e relay.Event
		var key, headers *string
		if err := rows.Scan(&e.ID, &txid, &e.EventID, &e.Topic, &key, &e.Payload, &headers, &e.CreatedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("poller: reading events: %w", err)
		}
		major, err := strconv.ParseUint(txid, 10, 64)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("poller: transaction id %q: %w", txid, err)
		}
		if key != nil {
			e.Key = []byte(*key)
		}
		if headers != nil {
			e.Headers = []byte(*headers)
		}
		e.Position = relay.Position{Major: major, Minor: uint64(e.ID)}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("poller: reading events: %w", err)
	}
	if len(events) > 0 {
		p.cursor = events[len(events)-1].Position
	}
	return events, nil
}

// wait blocks until a notification, the poll interval, or, when rows are
// waiting behind the horizon, a short backoff.
func (p *Poller) wait(ctx context.Context) error {
	var pending bool
	if err := p.conn.QueryRow(ctx, p.pending, strconv.FormatUint(p.cursor.Major, 10), int64(p.cursor.Minor)).Scan(&pending); err != nil {
		return fmt.Errorf("poller: checking for pending events: %w", err)
	}
	timeout := p.cfg.PollInterval
	if pending {
		p.backoff = min(max(2*p.backoff, time.Millisecond), 100*time.Millisecond, p.cfg.PollInterval)
		timeout = p.backoff
	}
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if pending {
		go func() {
			select {
			case <-p.acked:
				cancel()
			case <-waitCtx.Done():
			}
		}()
	}
	_, err := p.listen.WaitForNotification(waitCtx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case waitCtx.Err() != nil:
		return nil
	default:
		return fmt.Errorf("poller: waiting for notifications: %w", err)
	}
}

// Acked wakes a wait for rows behind the horizon; the core deletes the
// published rows itself.
func (p *Poller) Acked(context.Context, relay.Position) error {
	select {
	case p.acked <- struct{}{}:
	default:
	}
	return nil
}

// Close closes the poller's connections.
func (p *Poller) Close(ctx context.Context) error {
	var errs []error
	for _, c := range []**pgx.Conn{&p.conn, &p.listen} {
		if *c != nil {
			errs = append(errs, (*c).Close(ctx))
			*c = nil
		}
	}
	return errors.Join(errs...)
}
