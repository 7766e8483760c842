use stockgate_testkit::pgtemp::TempPostgres;

#[tokio::test]
async fn starts_and_answers_select_1() {
    let pg = TempPostgres::start().await.expect("start postgres");
    let pool = sqlx::PgPool::connect(pg.url()).await.expect("connect");
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&pool)
        .await
        .expect("select 1");
    assert_eq!(one, 1);
    pool.close().await;
    let dir_gone_check = pg.port();
    drop(pg);
    assert!(dir_gone_check.is_some() || std::env::var("STOCKGATE_TEST_DATABASE_URL").is_ok());
}

#[tokio::test]
async fn stop_and_restart_keeps_data() {
    let mut pg = TempPostgres::start().await.expect("start postgres");
    if pg.port().is_none() {
        return; // external server: we do not own the process
    }
    {
        let pool = sqlx::PgPool::connect(pg.url()).await.expect("connect");
        sqlx::query("create table t (x int)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("insert into t values (7)")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    pg.stop().unwrap();
    assert!(!pg.is_running());
    use sqlx::Connection;
    assert!(sqlx::PgConnection::connect(pg.url()).await.is_err());
    pg.restart(Default::default()).await.expect("restart");
    let pool = sqlx::PgPool::connect(pg.url()).await.expect("connect");
    let x: i32 = sqlx::query_scalar("select x from t")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(x, 7);
}
