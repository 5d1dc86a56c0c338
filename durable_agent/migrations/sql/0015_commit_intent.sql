-- durable_agent_commit_intent: one gate.transaction commit's alarm transaction, server-side.
--
-- Note [The commit function]
--     On PostgreSQL, gate.transaction replays a host's buffered intent (lane enrollments and
--     source progress, see durable_agent/maintenance/commit_function.py) by calling this
--     function once, inside the caller's transaction: one round trip instead of the four to
--     six statements of run_alarm_transaction. It does what run_alarm_transaction,
--     DueQueue.dirty, _keep_armed and apply_checkpoint do for that intent, in the same order:
--
--     1. Lock the host's state row (creating it as dirty=1, processed=0 on first use); when
--        the intent advances dirty or clears the durable native backoff (step 4), the UPDATE
--        that writes it is the lock (FOR NO KEY UPDATE, which every FOR UPDATE waits for).
--     2. Lock the host's lanes (ORDER BY lane, FOR UPDATE), then read the host and its slot
--        in a later statement: Note [Read the slot after the lock] holds because a
--        VOLATILE PL/pgSQL function takes a fresh snapshot for each statement.
--     3. Write each changed lane with a revision compare-and-set, insert new lanes (the
--        native lane is registered due at the epoch, as DueQueue.register does); a lost
--        compare-and-set or insert raises SQLSTATE DA002 (RevisionConflict).
--     4. Advance dirty and clear the durable native backoff, as the progress ops asked (done
--        by step 1's statement).
--     5. Move the slot earlier to the wake time (create it, arm it, move it, or keep it when
--        it already holds an earlier time) with the same Schedule fields apply_checkpoint
--        writes, and point Host.alarm at a created slot. A fired slot whose task is recorded
--        and whose deadline is after p_queued_after holds its queued delivery and counts as
--        armed at that deadline; any write clears the task (Note [A queued delivery holds the
--        slot] in durable_agent/maintenance/store/rows.py).
--
--     Lock order is Note [Lock order]: state row -> lanes -> schedule row.
--     tests/locks.py records a call of this function as those three locks, and
--     tests/maintenance/mutations/test_commit_function.py checks the order against a second connection.
--
--     The arguments are the intent folded per lane by Python (one entry per lane touched):
--     the earliest deadline any call requested, how many calls were source progress, and
--     whether the first call was. The folding is exact for deadlines at or after the epoch;
--     Python keeps anything else on the Python path. Returns the number of lane rows written.
--
--     Errors: DA001 no such host (HostNotFound), DA002 a lane changed behind the view
--     (RevisionConflict, the lane in the DETAIL), DA003 a negative generation (AlarmError).
CREATE OR REPLACE FUNCTION durable_agent_commit_intent(
    p_host bigint,
    p_lanes text[],                 -- lanes the intent touches
    p_due timestamptz[],            -- per lane: the earliest deadline requested
    p_bumps integer[],              -- per lane: how many calls were source progress
    p_first_bump boolean[],         -- per lane: the first call was source progress
    p_native text,                  -- the native lane id (always registered)
    p_dirty_bumps bigint,           -- native progress ops outside native_source
    p_native_touched boolean,       -- some op recorded native progress
    p_wake timestamptz,             -- the last op's now + minimum delay
    p_wake_after_lanes boolean,     -- the last op was an enrollment: wake at the earliest lane
    p_now timestamptz,              -- clock.now(): updated_at of a changed state row
    p_created timestamptz,          -- timezone.now(): updated_at of a created state row
    p_max_stalls integer,           -- backoff.MAXIMUM_NO_PROGRESS_REARMS
    p_epoch timestamptz,            -- due_queue.EPOCH
    p_alarm_func text,              -- conf.alarm_task()
    p_alarm_cluster text,           -- conf.alarm_cluster()
    p_queued_after timestamptz      -- rows.queued_after(p_now): a queued delivery's horizon
) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_state durable_agent_maintenancestate%ROWTYPE;
    v_lane record;
    v_i integer;
    v_seen text[] := '{}';
    v_written integer := 0;
    v_count integer;
    v_earliest timestamptz;
    v_due timestamptz;
    v_revision bigint;
    v_stalls smallint;
    v_not_before timestamptz;
    v_state_name varchar;
    v_reported boolean;
    v_host_found boolean;
    v_slot_id integer;
    v_slot_repeats integer;
    v_slot_next timestamptz;
    v_slot_task varchar;
    v_current timestamptz;
    v_wake timestamptz;
    v_target timestamptz;
BEGIN
    -- 1 and 4. The state row, locked (created on first use) and, when the intent changes it,
    -- written by the same statement: the UPDATE's row lock is the lock. A changed row gets
    -- updated_at = p_now, as _flush_state does.
    LOOP
        IF p_dirty_bumps > 0 OR p_native_touched THEN
            UPDATE durable_agent_maintenancestate
                SET dirty = dirty + p_dirty_bumps,
                    retry_generation = CASE WHEN p_native_touched THEN NULL ELSE retry_generation END,
                    retry_not_before = CASE WHEN p_native_touched THEN NULL ELSE retry_not_before END,
                    retry_native_only = CASE WHEN p_native_touched THEN NULL ELSE retry_native_only END,
                    retry_stalls = CASE WHEN p_native_touched THEN NULL ELSE retry_stalls END,
                    updated_at = CASE
                        WHEN p_dirty_bumps > 0 OR retry_generation IS NOT NULL THEN p_now
                        ELSE updated_at
                    END
                WHERE host_id = p_host
                RETURNING * INTO v_state;
        ELSE
            SELECT * INTO v_state FROM durable_agent_maintenancestate
                WHERE host_id = p_host FOR UPDATE;
        END IF;
        EXIT WHEN FOUND;
        PERFORM 1 FROM durable_agent_host WHERE id = p_host;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'No host with id %', p_host USING ERRCODE = 'DA001';
        END IF;
        -- First use: dirty=1, processed=0, then the intent's bumps (retry fields start null).
        INSERT INTO durable_agent_maintenancestate (
            host_id, dirty, processed, nonterminal, recovery_event_sequence,
            recovery_event_acknowledged, updated_at
        ) VALUES (
            p_host, 1 + p_dirty_bumps, 0, 0, 0, 0,
            CASE WHEN p_dirty_bumps > 0 THEN p_now ELSE p_created END
        ) ON CONFLICT DO NOTHING
        RETURNING * INTO v_state;  -- our own uncommitted row: nobody else can lock it
        EXIT WHEN FOUND;  -- else a concurrent first use inserted it: lock it (loop again)
    END LOOP;
    IF v_state.dirty - p_dirty_bumps < 0 OR v_state.processed < 0 THEN
        RAISE EXCEPTION 'Maintenance generations must not be negative' USING ERRCODE = 'DA003';
    END IF;

    -- 2 and 3. The lanes, locked in lane order, each written once with its compare-and-set.
    FOR v_lane IN
        SELECT id, lane, revision, due_at, stalls, progress_key, not_before, state, reported
        FROM durable_agent_duelane WHERE host_id = p_host ORDER BY lane FOR UPDATE
    LOOP
        v_seen := v_seen || v_lane.lane::text;
        v_i := array_position(p_lanes, v_lane.lane::text);
        IF v_i IS NULL THEN
            v_earliest := LEAST(v_earliest, v_lane.due_at);
            CONTINUE;
        END IF;
        IF p_bumps[v_i] > 0 THEN  -- progress: due at the request, the budget refilled
            v_revision := v_lane.revision + p_bumps[v_i];
            v_due := p_due[v_i];
            v_stalls := 0;
            v_not_before := NULL;
            v_state_name := 'pending';
            v_reported := false;
        ELSE  -- enrollment: never later, never below the floor, a parked lane stays parked
            v_revision := v_lane.revision;
            v_due := GREATEST(COALESCE(v_lane.not_before, p_epoch), LEAST(v_lane.due_at, p_due[v_i]));
            v_stalls := v_lane.stalls;
            v_not_before := v_lane.not_before;
            v_state_name := CASE WHEN v_lane.stalls < p_max_stalls THEN 'pending' ELSE v_lane.state END;
            v_reported := v_lane.reported;
        END IF;
        v_earliest := LEAST(v_earliest, v_due);
        IF (v_revision, v_due, v_stalls, v_not_before, v_state_name, v_reported)
           IS DISTINCT FROM
           (v_lane.revision, v_lane.due_at, v_lane.stalls, v_lane.not_before, v_lane.state, v_lane.reported)
        THEN
            UPDATE durable_agent_duelane
                SET revision = v_revision, due_at = v_due, stalls = v_stalls,
                    not_before = v_not_before, state = v_state_name, reported = v_reported
                WHERE host_id = p_host AND lane = v_lane.lane AND revision = v_lane.revision;
            GET DIAGNOSTICS v_count = ROW_COUNT;
            IF v_count <> 1 THEN
                RAISE EXCEPTION 'Maintenance due revision changed during transaction'
                    USING ERRCODE = 'DA002', DETAIL = v_lane.lane;
            END IF;
            v_written := v_written + 1;
        END IF;
    END LOOP;

    -- New lanes: the native lane is registered first (revision 0, due at the epoch), then
    -- the intent applies to it as to an existing lane; any other lane is created by its
    -- first call with revision 1, and each later progress call adds one.
    IF NOT (p_native = ANY (v_seen)) AND NOT (p_native = ANY (p_lanes)) THEN
        INSERT INTO durable_agent_duelane (
            host_id, lane, revision, due_at, stalls, progress_key, not_before, state, reported
        ) VALUES (p_host, p_native, 0, p_epoch, 0, NULL, NULL, 'pending', false)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count <> 1 THEN
            RAISE EXCEPTION 'Maintenance due revision changed during transaction'
                USING ERRCODE = 'DA002', DETAIL = p_native;
        END IF;
        v_written := v_written + 1;
        v_earliest := LEAST(v_earliest, p_epoch);
    END IF;
    FOR v_i IN 1 .. COALESCE(array_length(p_lanes, 1), 0) LOOP
        CONTINUE WHEN p_lanes[v_i] = ANY (v_seen);
        IF p_lanes[v_i] = p_native THEN
            v_revision := p_bumps[v_i];
            v_due := CASE WHEN p_bumps[v_i] > 0 THEN p_due[v_i] ELSE p_epoch END;
        ELSE
            v_revision := 1 + p_bumps[v_i] - CASE WHEN p_first_bump[v_i] THEN 1 ELSE 0 END;
            v_due := p_due[v_i];
        END IF;
        INSERT INTO durable_agent_duelane (
            host_id, lane, revision, due_at, stalls, progress_key, not_before, state, reported
        ) VALUES (p_host, p_lanes[v_i], v_revision, v_due, 0, NULL, NULL, 'pending', false)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count <> 1 THEN
            RAISE EXCEPTION 'Maintenance due revision changed during transaction'
                USING ERRCODE = 'DA002', DETAIL = p_lanes[v_i];
        END IF;
        v_written := v_written + 1;
        v_earliest := LEAST(v_earliest, v_due);
    END LOOP;

    -- 5. The slot, read after the locks above.
    SELECT true, s.id, s.repeats, s.next_run, s.task
        INTO v_host_found, v_slot_id, v_slot_repeats, v_slot_next, v_slot_task
        FROM durable_agent_host h LEFT OUTER JOIN django_q_schedule s ON h.alarm_id = s.id
        WHERE h.id = p_host;
    IF v_host_found IS NULL THEN
        RAISE EXCEPTION 'No host with id %', p_host USING ERRCODE = 'DA001';
    END IF;
    v_current := CASE
        WHEN v_slot_id IS NULL THEN NULL
        WHEN v_slot_repeats <> 0 THEN v_slot_next
        WHEN v_slot_task <> '' AND v_slot_next > p_queued_after THEN v_slot_next  -- queued
        ELSE NULL
    END;
    v_wake := CASE WHEN p_wake_after_lanes THEN GREATEST(v_earliest, p_wake) ELSE p_wake END;
    v_target := CASE WHEN v_current IS NULL OR v_current > v_wake THEN v_wake ELSE v_current END;
    IF v_target IS DISTINCT FROM v_current THEN
        IF v_slot_id IS NULL THEN
            INSERT INTO django_q_schedule (
                name, func, hook, args, kwargs, schedule_type, minutes, repeats, next_run,
                cron, task, cluster, intended_date_kwarg
            ) VALUES (
                'durable_agent:host:' || p_host, p_alarm_func, NULL, p_host::text, NULL, 'O',
                NULL, 1, v_target, NULL, NULL, p_alarm_cluster, 'deadline'
            ) RETURNING id INTO v_slot_id;
            UPDATE durable_agent_host SET alarm_id = v_slot_id WHERE id = p_host;
        ELSE
            UPDATE django_q_schedule SET next_run = v_target, repeats = 1, task = NULL
                WHERE id = v_slot_id;
        END IF;
    END IF;
    RETURN v_written;
END;
$$;
