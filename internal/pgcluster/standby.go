package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions tune a physical standby started by StartStandby.
type StandbyOptions struct {
	// Slot is the physical replication slot StartStandby creates on the
	// primary for the standby (primary_slot_name); required.
	Slot string
	// Database is the database named in the standby's primary_conninfo,
	// which slot synchronization (sync_replication_slots, PostgreSQL 17
	// and later) connects to; "postgres" when empty.
	Database string
	// Settings are extra postgresql.conf settings of the standby, over
	// the primary's and the standby defaults (hot_standby and
	// hot_standby_feedback on).
	Settings map[string]string
}

// StartStandby makes a streaming physical standby of a local cluster and
// starts it. It copies the primary's files between the low-level backup
// functions (pg_backup_start and pg_backup_stop, or pg_start_backup and
// pg_stop_backup before PostgreSQL 15), so that no pg_basebackup is needed,
// and the standby streams the WAL from the backup's start on through a
// physical slot created first. The returned cluster accepts read-only
// connections; Promote makes it a primary.
func (c *Cluster) StartStandby(ctx context.Context, opts StandbyOptions) (*Cluster, error) {
	if c.local == nil {
		return nil, fmt.Errorf("pgcluster: a standby needs a local primary, not a %s one", c.kind)
	}
	if opts.Slot == "" {
		return nil, errors.New("pgcluster: StartStandby needs a physical slot name")
	}
	major, err := c.Major(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", opts.Slot); err != nil {
		return nil, fmt.Errorf("pgcluster: creating the standby's slot: %w", err)
	}
	start, stop := "SELECT pg_backup_start('relay-standby', true)", "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
	if major < 15 {
		start, stop = "SELECT pg_start_backup('relay-standby', true, false)", "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)"
	}
	if _, err := conn.Exec(ctx, start); err != nil {
		return nil, fmt.Errorf("pgcluster: starting the base backup: %w", err)
	}
	s, err := newLocalServer(c.local.bin)
	if err != nil {
		return nil, err
	}
	copyErr := copyDataDir(c.local.dataDir, s.dataDir, s.cred)
	var label, spcmap string
	if err := conn.QueryRow(ctx, stop).Scan(&label, &spcmap); err != nil || copyErr != nil {
		os.RemoveAll(s.root)
		return nil, fmt.Errorf("pgcluster: base backup: %w", errors.Join(copyErr, err))
	}
	files := map[string]string{"backup_label": label, "standby.signal": ""}
	if spcmap != "" {
		files["tablespace_map"] = spcmap
	}
	for name, content := range files {
		if err := writeOwned(filepath.Join(s.dataDir, name), []byte(content), s); err != nil {
			os.RemoveAll(s.root)
			return nil, err
		}
	}
	db := opts.Database
	if db == "" {
		db = "postgres"
	}
	conf := maps.Clone(c.local.settings)
	conf["hot_standby"] = "on"
	conf["hot_standby_feedback"] = "on"
	conf["primary_slot_name"] = opts.Slot
	conf["primary_conninfo"] = fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s application_name=%s", c.local.port, db, opts.Slot)
	maps.Copy(conf, opts.Settings)
	return s.launch(ctx, conf)
}

// Promote ends a standby's recovery (pg_promote) and waits until it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("pgcluster: promoting: %w", err)
	}
	if !ok {
		return errors.New("pgcluster: the standby did not finish its promotion within 60 s")
	}
	return nil
}

// skipContents are the data directory's subdirectories whose contents a
// base backup leaves out (as pg_basebackup does): the WAL streams from the
// primary, the slots are the primary's, the rest is runtime state.
var skipContents = map[string]bool{
	"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true, "pg_notify": true,
	"pg_serial": true, "pg_snapshots": true, "pg_subtrans": true,
}

// skipFiles are files of the primary's data directory that a base backup
// leaves out.
var skipFiles = map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "standby.signal": true, "recovery.signal": true}

// copyDataDir copies a running server's data directory, keeping modes and
// giving the copies to cred's user (nil: the current user). Files that vanish during the
// copy are skipped: the WAL replay from the backup's start restores them.
func copyDataDir(src, dst string, cred *syscall.Credential) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		if d.IsDir() {
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
			if err := own(target, cred); err != nil {
				return err
			}
			if skipContents[rel] {
				if rel == "pg_wal" {
					if err := os.Mkdir(filepath.Join(target, "archive_status"), 0o700); err != nil {
						return err
					}
					if err := own(filepath.Join(target, "archive_status"), cred); err != nil {
						return err
					}
				}
				return filepath.SkipDir
			}
			return nil
		}
		if skipFiles[rel] || !info.Mode().IsRegular() {
			return nil
		}
		if err := copyFile(path, target, info.Mode().Perm()); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return own(target, cred)
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// own gives path to cred's user; nil cred leaves it to the current user.
func own(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return os.Lchown(path, int(cred.Uid), int(cred.Gid))
}

// writeOwned writes a file of the server's data directory.
func writeOwned(path string, content []byte, s *localServer) error {
	if err := os.WriteFile(path, content, 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if err := own(path, s.cred); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}
