package poller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/store"
)

// Config configures a Poller. The zero value of every field but
// DatabaseURL takes a default.
type Config struct {
	// DatabaseURL is the connection string; empty means the PG* variables.
	DatabaseURL string
	// Schema holds the outbox table (default "outbox").
	Schema string
	// PollInterval is how often the poller reads without a notification
	// (default 1s).
	PollInterval time.Duration
	// Logger receives the poller's logs (default: slog.Default()).
	Logger *slog.Logger
	// MaxMessageBytes is the core's message limit: a row whose key,
	// payload and headers (as JSON text) are larger is delivered without
	// them, with relay.Event.TooLarge set (default 1 MiB - 512, as the core's).
	MaxMessageBytes int
	// PageBytes bounds the bytes of the rows one Next returns, beside its
	// row count; a single larger row comes alone (default 8 MiB).
	PageBytes int
}

// DefaultPollInterval is Config.PollInterval's default (and `relay run
// --poll-interval`'s).
const DefaultPollInterval = time.Second

// WithDefaults returns c with its unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = relay.DefaultMaxMessageBytes
	}
	if c.PageBytes <= 0 {
		c.PageBytes = 8 << 20
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

// tick is a recorded snapshot.
type tick struct {
	n    uint64
	snap string
	// byTS: the batch is ordered by commit timestamp.
	byTS bool
}

// batch is the tick being delivered.
type batch struct {
	tick
	// prev is the previous tick's snapshot; nil means none: the batch is
	// every visible row still in the outbox.
	prev *string
	// ordinal is the Minor of the last event delivered.
	ordinal uint64
	started bool
	// lastID is the row id of the last event delivered (row-id order).
	lastID int64
	// In commit-timestamp order: the sort key of the last event delivered
	// and, once the batch proved large, the ids still to deliver.
	lastKey  int64
	lastTxid string
	listed   bool
	ids      []int64
	sizes    []int64
	done     bool
}

// Poller is a relay.Source that reads the outbox table with SQL.
type Poller struct {
	cfg Config
	// q are the reader's statements (relay/store).
	q   *store.PollReader
	lim limits

	conn   *pgx.Conn
	listen *pgx.Conn
	// byTS is whether the server tracks commit timestamps.
	byTS bool
	// nextTick numbers the next recorded tick.
	nextTick uint64
	// prev is the snapshot of the last tick whose batch is fully delivered;
	// nil: none since Start.
	prev *string
	// replay holds recorded ticks to deliver again after a restart.
	replay []tick
	// resume is the ordinal the first replayed tick was acknowledged to.
	resume uint64
	cur    *batch

	// acked is the highest acknowledged tick (set by Acked, from the core's
	// acknowledgement goroutine); pruned is what the poller last deleted
	// below.
	acked  atomic.Uint64
	pruned uint64

	// rows limits the rows a page read asks for while they are large.
	rows rowLimit

	// asleep: the connection holds the sleep lock, so writers notify;
	// busy is the last wait while a writer kept the reader from sleeping.
	asleep bool
	busy   time.Duration

	wake       chan struct{}
	listenErr  chan error
	stopListen context.CancelFunc
	listenDone chan struct{}
}

var _ relay.Source = (*Poller)(nil)

// New returns a Poller; it connects in Start.
func New(cfg Config) (*Poller, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lim := limits{message: int64(cfg.MaxMessageBytes), page: int64(cfg.PageBytes)}
	return &Poller{cfg: cfg, q: store.NewPollReader(cfg.Schema, lim.message), lim: lim}, nil
}

// Start connects, listens for commits and prepares to deliver the events
// after from: the rest of from's tick when it is recorded, the recorded
// ticks after it, then new ones.
func (p *Poller) Start(ctx context.Context, from relay.Position) error {
	p.Close(ctx)
	conn, err := pgconfig.Connect(ctx, p.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			conn.Close(ctx)
		}
	}()
	if err := p.refuseMessages(ctx, conn); err != nil {
		return err
	}
	if p.byTS, err = p.q.PrepareSession(ctx, conn); err != nil {
		return fmt.Errorf("poller: %w", err)
	}
	replay, resume, next, err := p.loadTicks(ctx, conn, from)
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
		return err
	}
	if err := p.q.Listen(ctx, listen); err != nil {
		listen.Close(ctx)
		return fmt.Errorf("poller: LISTEN: %w", err)
	}
	ok = true
	p.conn, p.listen = conn, listen
	p.replay, p.resume, p.nextTick, p.prev, p.cur = replay, resume, next, nil, nil
	p.acked.Store(0)
	p.pruned = 0
	p.asleep, p.busy = false, 0
	p.wake = make(chan struct{}, 1)
	p.listenErr = make(chan error, 1)
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stopListen, p.listenDone = stop, make(chan struct{})
	go p.listenLoop(lctx, listen, p.wake, p.listenErr, p.listenDone)
	if len(replay) > 0 {
		p.cfg.Logger.Info("poller: delivering unacknowledged ticks again", "from", from.String(), "ticks", len(replay))
	}
	return nil
}

// loadTicks returns the recorded ticks to deliver again after from (from's
// own first), the ordinal of from within its tick, and the next tick number.
// Ticks before from's are deleted; when from's tick is not recorded (a first
// start, a checkpoint of another reader, a pruned or truncated table) all
// are, and delivery starts from every visible row.
func (p *Poller) loadTicks(ctx context.Context, conn *pgx.Conn, from relay.Position) ([]tick, uint64, uint64, error) {
	maxTick, err := p.q.MaxTick(ctx, conn)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("poller: reading ticks: %w", err)
	}
	next := max(uint64(maxTick), from.Major) + 1
	recorded, err := p.q.LoadTicks(ctx, conn, int64(from.Major))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("poller: reading ticks: %w", err)
	}
	ticks := make([]tick, 0, len(recorded))
	for _, t := range recorded {
		ticks = append(ticks, tick{n: uint64(t.N), snap: t.Snapshot, byTS: t.ByTS})
	}
	if from.IsZero() || len(ticks) == 0 || ticks[0].n != from.Major {
		if err := p.q.ClearTicks(ctx, conn); err != nil {
			return nil, 0, 0, fmt.Errorf("poller: clearing ticks: %w", err)
		}
		return nil, 0, next, nil
	}
	if err := p.q.PruneTicks(ctx, conn, int64(from.Major)); err != nil {
		return nil, 0, 0, fmt.Errorf("poller: pruning ticks: %w", err)
	}
	for i := range ticks {
		if ticks[i].byTS && !p.byTS {
			p.cfg.Logger.Warn("poller: a recorded tick was ordered by commit timestamp, which the server no longer tracks; delivering it again in row-id order",
				"tick", ticks[i].n)
			ticks[i].byTS = false
		}
	}
	return ticks, from.Minor, next, nil
}

// listenLoop turns notifications into a wake-up; several arriving while
// Next reads coalesce into one.
func (p *Poller) listenLoop(ctx context.Context, listen *pgx.Conn, wake chan<- struct{}, errc chan<- error, done chan<- struct{}) {
	defer close(done)
	for {
		if _, err := listen.WaitForNotification(ctx); err != nil {
			if ctx.Err() == nil {
				errc <- err
			}
			return
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// Next returns up to max events of the current batch, starting the next
// one (recorded, or a new tick) when it is done, and waits for a commit
// when there is nothing to deliver.
func (p *Poller) Next(ctx context.Context, max int) ([]relay.Event, error) {
	if p.conn == nil {
		return nil, errors.New("poller: Next before Start")
	}
	for {
		if p.cur != nil {
			events, err := p.page(ctx, max)
			if err != nil {
				return nil, err
			}
			p.finish()
			if len(events) > 0 {
				return events, nil
			}
			continue
		}
		if len(p.replay) > 0 {
			t := p.replay[0]
			p.replay = p.replay[1:]
			p.cur = &batch{tick: t, prev: p.prev, ordinal: p.resume}
			p.resume = 0
			continue
		}
		events, err := p.fresh(ctx, max)
		if err != nil {
			return nil, err
		}
		if len(events) > 0 {
			p.busy = 0
			if p.asleep {
				// Rows came in before the lock was taken: stay awake.
				if err := p.wakeUp(ctx); err != nil {
					return nil, err
				}
			}
			return events, nil
		}
		if err := p.idle(ctx); err != nil {
			return nil, err
		}
	}
}

// maxBusy bounds the wait between reads while a writing transaction keeps
// the reader from sleeping.
const maxBusy = 16 * time.Millisecond

// idle waits after a read found nothing new; the caller reads again when it
// returns. Awake, the reader takes the sleep lock, and returns at once to
// read the rows of writers that committed before it without notifying;
// asleep (that read found nothing either), it waits for a notification or
// the poll interval, then releases the lock. While a writing transaction
// holds the lock shared, it reads again after a wait that doubles from 1 ms
// up to maxBusy. doc.go ("Wake-up and cost") says why nothing is missed.
func (p *Poller) idle(ctx context.Context) error {
	if p.asleep {
		if err := p.wait(ctx, p.cfg.PollInterval); err != nil {
			return err
		}
		return p.wakeUp(ctx)
	}
	ok, err := p.q.Sleep(ctx, p.conn)
	if err != nil {
		return fmt.Errorf("poller: taking the sleep lock: %w", err)
	}
	if ok {
		p.asleep, p.busy = true, 0
		return nil
	}
	p.busy = min(max(2*p.busy, time.Millisecond), maxBusy, p.cfg.PollInterval)
	return p.wait(ctx, p.busy)
}

// wakeUp releases the sleep lock: writers stop notifying.
func (p *Poller) wakeUp(ctx context.Context) error {
	if err := p.q.Wake(ctx, p.conn); err != nil {
		return fmt.Errorf("poller: releasing the sleep lock: %w", err)
	}
	p.asleep = false
	return nil
}

// finish moves on from the current batch once it is fully delivered.
func (p *Poller) finish() {
	if p.cur != nil && p.cur.done {
		snap := p.cur.snap
		p.prev, p.cur = &snap, nil
	}
}

// wait blocks until a notification or for d.
func (p *Poller) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-p.wake:
		return nil
	case <-t.C:
		return nil
	case err := <-p.listenErr:
		return fmt.Errorf("poller: waiting for notifications: %w", err)
	}
}

// Acked lets the next tick delete the recorded ticks before through's: a
// restart delivers again from through's tick at the earliest.
func (p *Poller) Acked(_ context.Context, through relay.Position) error {
	for {
		old := p.acked.Load()
		if through.Major <= old || p.acked.CompareAndSwap(old, through.Major) {
			return nil
		}
	}
}

// Close closes the poller's connections.
func (p *Poller) Close(ctx context.Context) error {
	if p.stopListen != nil {
		p.stopListen()
		<-p.listenDone
		p.stopListen = nil
	}
	var errs []error
	for _, c := range []**pgx.Conn{&p.conn, &p.listen} {
		if *c != nil {
			errs = append(errs, (*c).Close(ctx))
			*c = nil
		}
	}
	return errors.Join(errs...)
}
