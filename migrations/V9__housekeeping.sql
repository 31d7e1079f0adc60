-- Finished webhook deliveries are pruned after a week (store/prune.rs), as
-- refused sends are: this index finds them without reading the queue.
CREATE INDEX webhook_deliveries_finished_idx ON webhook_deliveries (finished_at)
    WHERE state <> 'pending';
