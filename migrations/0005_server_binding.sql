-- The server history this ledger describes (`INFO`'s `stockgate_history`), recorded by the
-- first tool that talks to a server. Every tool that writes to the ledger compares it with
-- the server's before acting, so a ledger is never applied to another server, a wiped data
-- dir or another group. One row at most; `stockgate-sweeper rebind` moves it deliberately.
CREATE TABLE server_binding (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    history_id TEXT NOT NULL,
    bound_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
