package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/migrations"
)

// DB is a connection or pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Error is a registry error with the Confluent API's status and code.
type Error struct {
	Status int
	Code   int
	Msg    string
	// Violations are the reasons of an incompatible schema.
	Violations []Violation
}

func (e *Error) Error() string {
	if len(e.Violations) == 0 {
		return e.Msg
	}
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.String()
	}
	return e.Msg + ": " + strings.Join(parts, "; ")
}

func errorf(status, code int, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// The Confluent API's error codes.
const (
	codeSubjectNotFound   = 40401
	codeVersionNotFound   = 40402
	codeSchemaNotFound    = 40403
	codeSubjectSoftDelete = 40404
	codeNotSoftDeleted    = 40405
	codeNoSubjectConfig   = 40408
	codeIncompatible      = 409
	codeInvalidSchema     = 42201
	codeInvalidVersion    = 42202
	codeInvalidLevel      = 42203
)

// Store is the registry's state in Postgres, in the relay's schema
// (migration 010).
type Store struct {
	db                                 DB
	schemas, versions, config, stateTb string
}

// NewStore returns the store in schema's tables.
func NewStore(db DB, schema string) (*Store, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	q := func(t string) string { return `"` + schema + `".` + t }
	return &Store{db: db, schemas: q("registry_schemas"), versions: q("registry_versions"), config: q("registry_config"), stateTb: q("registry_state")}, nil
}

// Version is one version of a subject.
type Version struct {
	Subject string
	Version int
	ID      int
	Type    string
	Schema  string
	Deleted bool
}

// write runs fn in a transaction that first bumps the generation, which
// also serializes the registry's writers.
func (s *Store) write(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE `+s.stateTb+` SET generation = generation + 1`); err != nil {
			return fmt.Errorf("schema registry (is the schema migrated?): %w", err)
		}
		return fn(tx)
	})
}

// Generation counts the registry's writes.
func (s *Store) Generation(ctx context.Context) (int64, error) {
	var g int64
	if err := s.db.QueryRow(ctx, `SELECT generation FROM `+s.stateTb).Scan(&g); err != nil {
		return 0, fmt.Errorf("schema registry (is the schema migrated?): %w", err)
	}
	return g, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// knownHistory is history for a subject that has at least one version
// (deleted ones count when deleted is true): codeSubjectNotFound for one
// that has none.
func (s *Store) knownHistory(ctx context.Context, q querier, subject string, deleted bool) ([]Version, error) {
	hist, err := s.history(ctx, q, subject, deleted)
	if err != nil {
		return nil, err
	}
	if len(hist) == 0 {
		return nil, errorf(http.StatusNotFound, codeSubjectNotFound, "subject %q not found", subject)
	}
	return hist, nil
}

// history returns a subject's versions, oldest first; deleted ones only
// with deleted.
func (s *Store) history(ctx context.Context, q querier, subject string, deleted bool) ([]Version, error) {
	rows, err := q.Query(ctx, `SELECT v.version, v.schema_id, s.schema_type, s.schema, v.deleted FROM `+s.versions+` v JOIN `+s.schemas+` s ON s.id = v.schema_id
WHERE v.subject = $1 AND ($2 OR NOT v.deleted) ORDER BY v.version`, subject, deleted)
	if err != nil {
		return nil, fmt.Errorf("schema registry (is the schema migrated?): %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Version, error) {
		v := Version{Subject: subject}
		err := row.Scan(&v.Version, &v.ID, &v.Type, &v.Schema, &v.Deleted)
		return v, err
	})
}

// Level returns the compatibility level that applies to subject: its
// own, else the global one, else DefaultCompatibility.
func (s *Store) Level(ctx context.Context, subject string) (string, error) {
	return s.level(ctx, s.db, subject)
}

func (s *Store) level(ctx context.Context, q querier, subject string) (string, error) {
	var level string
	err := q.QueryRow(ctx, `SELECT compatibility FROM `+s.config+` WHERE subject IN ($1, '') ORDER BY subject DESC LIMIT 1`, subject).Scan(&level)
	if errors.Is(err, pgx.ErrNoRows) {
		return DefaultCompatibility, nil
	}
	if err != nil {
		return "", fmt.Errorf("schema registry (is the schema migrated?): %w", err)
	}
	return level, nil
}

// Config returns a subject's own level ("" is the global one); ok is false
// when none is set.
func (s *Store) Config(ctx context.Context, subject string) (level string, ok bool, err error) {
	err = s.db.QueryRow(ctx, `SELECT compatibility FROM `+s.config+` WHERE subject = $1`, subject).Scan(&level)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("schema registry (is the schema migrated?): %w", err)
	}
	return level, true, nil
}

// SetConfig sets a subject's level ("" is the global one); the subject
// need not exist yet.
func (s *Store) SetConfig(ctx context.Context, subject, level string) error {
	l, err := ParseLevel(level)
	if err != nil {
		return &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidLevel, Msg: err.Error()}
	}
	return s.write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+s.config+` (subject, compatibility) VALUES ($1, $2)
ON CONFLICT (subject) DO UPDATE SET compatibility = excluded.compatibility`, subject, l)
		return err
	})
}

// DeleteConfig removes a subject's own level and returns what it was.
func (s *Store) DeleteConfig(ctx context.Context, subject string) (string, error) {
	var level string
	err := s.write(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `DELETE FROM `+s.config+` WHERE subject = $1 RETURNING compatibility`, subject).Scan(&level)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", errorf(http.StatusNotFound, codeSubjectNotFound, "subject %q has no compatibility level of its own", subject)
	}
	return level, err
}

func parseChecked(vs []Version) ([]Checked, error) {
	out := make([]Checked, 0, len(vs))
	for _, v := range vs {
		sch, err := Parse(v.Type, v.Schema)
		if err != nil {
			return nil, fmt.Errorf("version %d of %q no longer parses: %w", v.Version, v.Subject, err)
		}
		out = append(out, Checked{Version: v.Version, Schema: sch})
	}
	return out, nil
}

func invalid(err error) *Error {
	return &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidSchema, Msg: err.Error()}
}

// parseRequest parses a schema of a request: its normalized type and the
// schema, or an invalid-schema error.
func parseRequest(typ, text string) (string, Schema, error) {
	t, err := NormalizeType(typ)
	if err != nil {
		return "", nil, invalid(err)
	}
	sch, err := Parse(t, text)
	if err != nil {
		return "", nil, invalid(err)
	}
	return t, sch, nil
}

// Register adds text as the subject's next version, unless the subject
// already has it (its version is returned). The schema must be compatible
// with the subject's versions under its level.
func (s *Store) Register(ctx context.Context, subject, typ, text string) (Version, error) {
	t, sch, err := parseRequest(typ, text)
	if err != nil {
		return Version{}, err
	}
	if subject == "" {
		return Version{}, errorf(http.StatusUnprocessableEntity, codeInvalidSchema, "the subject name is empty")
	}
	fp := sch.Fingerprint()
	var out Version
	err = s.write(ctx, func(tx pgx.Tx) error {
		hist, err := s.history(ctx, tx, subject, false)
		if err != nil {
			return err
		}
		for _, v := range hist {
			if v.Type == t {
				if other, err := Parse(v.Type, v.Schema); err == nil && other.Fingerprint() == fp {
					out = v
					return nil
				}
			}
		}
		level, err := s.level(ctx, tx, subject)
		if err != nil {
			return err
		}
		checked, err := parseChecked(hist)
		if err != nil {
			return err
		}
		if vs := Check(level, sch, checked); len(vs) > 0 {
			return &Error{Status: http.StatusConflict, Code: codeIncompatible,
				Msg: fmt.Sprintf("the schema is incompatible with an earlier version of %q under %s", subject, level), Violations: vs}
		}
		var id int
		err = tx.QueryRow(ctx, `INSERT INTO `+s.schemas+` (schema_type, schema, fingerprint) VALUES ($1, $2, $3)
ON CONFLICT (schema_type, fingerprint) DO UPDATE SET schema_type = excluded.schema_type RETURNING id`, t, text, fp[:]).Scan(&id)
		if err != nil {
			return err
		}
		var version int
		err = tx.QueryRow(ctx, `INSERT INTO `+s.versions+` (subject, version, schema_id)
SELECT $1, coalesce(max(version), 0) + 1, $2 FROM `+s.versions+` WHERE subject = $1 RETURNING version`, subject, id).Scan(&version)
		if err != nil {
			return err
		}
		var stored string
		if err := tx.QueryRow(ctx, `SELECT schema FROM `+s.schemas+` WHERE id = $1`, id).Scan(&stored); err != nil {
			return err
		}
		out = Version{Subject: subject, Version: version, ID: id, Type: t, Schema: stored}
		return nil
	})
	return out, err
}

// Lookup finds the subject's version whose schema is text (the same
// canonical form).
func (s *Store) Lookup(ctx context.Context, subject, typ, text string, deleted bool) (Version, error) {
	t, sch, err := parseRequest(typ, text)
	if err != nil {
		return Version{}, err
	}
	hist, err := s.knownHistory(ctx, s.db, subject, deleted)
	if err != nil {
		return Version{}, err
	}
	fp := sch.Fingerprint()
	for i := len(hist) - 1; i >= 0; i-- {
		v := hist[i]
		if v.Type != t {
			continue
		}
		if other, err := Parse(v.Type, v.Schema); err == nil && other.Fingerprint() == fp {
			return v, nil
		}
	}
	return Version{}, errorf(http.StatusNotFound, codeSchemaNotFound, "schema not found in subject %q", subject)
}

// Subjects lists the subjects with a version (soft-deleted ones with
// deleted).
func (s *Store) Subjects(ctx context.Context, deleted bool) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT DISTINCT subject FROM `+s.versions+` WHERE $1 OR NOT deleted ORDER BY subject`, deleted)
	if err != nil {
		return nil, fmt.Errorf("schema registry (is the schema migrated?): %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Versions returns a subject's versions, oldest first.
func (s *Store) Versions(ctx context.Context, subject string, deleted bool) ([]Version, error) {
	return s.knownHistory(ctx, s.db, subject, deleted)
}

// Latest is the version number that names a subject's latest version.
const Latest = -1

// Get returns a version of a subject (Latest: the newest not deleted).
func (s *Store) Get(ctx context.Context, subject string, version int, deleted bool) (Version, error) {
	hist, err := s.history(ctx, s.db, subject, deleted || version != Latest)
	if err != nil {
		return Version{}, err
	}
	if version == Latest {
		if len(hist) == 0 {
			return Version{}, errorf(http.StatusNotFound, codeSubjectNotFound, "subject %q not found", subject)
		}
		return hist[len(hist)-1], nil
	}
	for _, v := range hist {
		if v.Version == version && (!v.Deleted || deleted) {
			return v, nil
		}
	}
	if len(hist) == 0 {
		return Version{}, errorf(http.StatusNotFound, codeSubjectNotFound, "subject %q not found", subject)
	}
	return Version{}, errorf(http.StatusNotFound, codeVersionNotFound, "subject %q has no version %d", subject, version)
}

// SchemaByID returns a schema by its id (Subject and Version are not set).
func (s *Store) SchemaByID(ctx context.Context, id int) (Version, error) {
	v := Version{ID: id}
	err := s.db.QueryRow(ctx, `SELECT schema_type, schema FROM `+s.schemas+` WHERE id = $1`, id).Scan(&v.Type, &v.Schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return Version{}, errorf(http.StatusNotFound, codeSchemaNotFound, "schema %d not found", id)
	}
	if err != nil {
		return Version{}, fmt.Errorf("schema registry (is the schema migrated?): %w", err)
	}
	return v, nil
}

// Compatible lists why text may not follow the subject's version (Latest,
// or a number) under the subject's level: the transitive levels compare
// with every version up to it.
func (s *Store) Compatible(ctx context.Context, subject string, version int, typ, text string) ([]Violation, string, error) {
	_, sch, err := parseRequest(typ, text)
	if err != nil {
		return nil, "", err
	}
	hist, err := s.history(ctx, s.db, subject, false)
	if err != nil {
		return nil, "", err
	}
	level, err := s.Level(ctx, subject)
	if err != nil {
		return nil, "", err
	}
	if version != Latest {
		n := -1
		for i, v := range hist {
			if v.Version == version {
				n = i
			}
		}
		if n < 0 {
			return nil, "", errorf(http.StatusNotFound, codeVersionNotFound, "subject %q has no version %d", subject, version)
		}
		hist = hist[:n+1]
	}
	checked, err := parseChecked(hist)
	if err != nil {
		return nil, "", err
	}
	return Check(level, sch, checked), level, nil
}

// DeleteSubject deletes a subject's versions: softly (they stay, marked,
// and may be hard-deleted later) or, with permanent, for good, which the
// Confluent API allows only after a soft delete. It returns the versions.
func (s *Store) DeleteSubject(ctx context.Context, subject string, permanent bool) ([]int, error) {
	var out []int
	err := s.write(ctx, func(tx pgx.Tx) error {
		hist, err := s.knownHistory(ctx, tx, subject, true)
		if err != nil {
			return err
		}
		live := 0
		for _, v := range hist {
			if !v.Deleted {
				live++
			}
		}
		q := `UPDATE ` + s.versions + ` SET deleted = true WHERE subject = $1 AND NOT deleted RETURNING version`
		if permanent {
			if live > 0 {
				return errorf(http.StatusNotFound, codeNotSoftDeleted, "subject %q must be soft-deleted before it is deleted permanently", subject)
			}
			q = `DELETE FROM ` + s.versions + ` WHERE subject = $1 RETURNING version`
		} else if live == 0 {
			return errorf(http.StatusNotFound, codeSubjectSoftDelete, "subject %q was soft-deleted already", subject)
		}
		rows, err := tx.Query(ctx, q, subject)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err
	})
	return out, err
}

// DeleteVersion deletes one version (Latest: the newest not deleted),
// softly or, after that, permanently.
func (s *Store) DeleteVersion(ctx context.Context, subject string, version int, permanent bool) (int, error) {
	err := s.write(ctx, func(tx pgx.Tx) error {
		hist, err := s.knownHistory(ctx, tx, subject, true)
		if err != nil {
			return err
		}
		var found *Version
		for i := range hist {
			v := &hist[i]
			if (version == Latest && !v.Deleted) || v.Version == version {
				found = v
			}
		}
		if found == nil {
			return errorf(http.StatusNotFound, codeVersionNotFound, "subject %q has no version %d", subject, version)
		}
		version = found.Version
		if permanent {
			if !found.Deleted {
				return errorf(http.StatusNotFound, codeNotSoftDeleted, "version %d of %q must be soft-deleted before it is deleted permanently", version, subject)
			}
			_, err := tx.Exec(ctx, `DELETE FROM `+s.versions+` WHERE subject = $1 AND version = $2`, subject, version)
			return err
		}
		if found.Deleted {
			return errorf(http.StatusNotFound, codeVersionNotFound, "version %d of %q was soft-deleted already", version, subject)
		}
		_, err = tx.Exec(ctx, `UPDATE `+s.versions+` SET deleted = true WHERE subject = $1 AND version = $2`, subject, version)
		return err
	})
	return version, err
}

// live returns every version not deleted, of every subject, for the
// validator.
func (s *Store) live(ctx context.Context) ([]Version, int64, error) {
	var out []Version
	var gen int64
	err := pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT generation FROM `+s.stateTb).Scan(&gen); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT v.subject, v.version, v.schema_id, s.schema_type, s.schema FROM `+s.versions+` v
JOIN `+s.schemas+` s ON s.id = v.schema_id WHERE NOT v.deleted ORDER BY v.subject, v.version`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Version, error) {
			var v Version
			err := row.Scan(&v.Subject, &v.Version, &v.ID, &v.Type, &v.Schema)
			return v, err
		})
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("reading the schema registry (is the schema migrated?): %w", err)
	}
	return out, gen, nil
}
