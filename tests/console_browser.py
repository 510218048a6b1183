"""The console's page in a real headless Chromium (Selenium), against a running console.

Usage: console_browser.py BASE_URL OUT_DIR
Signs in with the reader's token, opens the models list and a model's page, checks that a
description holding markup shows as text, promotes a version through the API as the team's writer
and waits for the page to show the move without a reload, opens a version's page (its load lines
and tensors) and the comparison of two versions, signs in with a wrong token and sees the store's
refusal. Screenshots of each page go to OUT_DIR. Exits non-zero, saying why, on any
failure or on any error in the browser's console.
"""

import json
import os
import sys
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

MARKUP = '<img src=x onerror="document.title=\'pwned\'">'


def post(base, path, token, body):
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method='POST',
        headers={'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def main():
    base, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    # A description with markup, set through the API by the team's writer.
    post(base, '/api/v1/models/team-a-resnet/versions/1/annotations', 'team-a-token',
         {'description': MARKUP})

    options = webdriver.ChromeOptions()
    for argument in ('--headless=new', '--no-sandbox', '--disable-dev-shm-usage',
                     '--window-size=1280,900'):
        options.add_argument(argument)
    options.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    driver = webdriver.Chrome(service=Service('/usr/bin/chromedriver'), options=options)
    wait = WebDriverWait(driver, 20)
    try:
        driver.get(base + '/')
        wait.until(EC.presence_of_element_located((By.ID, 'token'))).send_keys('reader-token')
        driver.find_element(By.CSS_SELECTOR, '#signin button[type=submit]').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'models'), 'team-a-resnet'))
        driver.save_screenshot(os.path.join(out, 'models.png'))

        driver.find_element(By.LINK_TEXT, 'team-a-resnet').click()
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, '#versions tbody tr')))
        rows = driver.find_elements(By.CSS_SELECTOR, '#versions tbody tr')
        assert len(rows) == 2, f'{len(rows)} version rows, want 2'
        description = driver.find_element(
            By.CSS_SELECTOR, '#versions tr[data-version="1"] td.description').text
        assert description == MARKUP, f'the description shows as {description!r}'
        assert not driver.find_elements(By.CSS_SELECTOR, '#versions img'), 'markup was rendered'
        assert driver.title != 'pwned', 'a script from the description ran'
        # The metric plot: one point per version that has the metric.
        points = driver.find_element(By.CSS_SELECTOR, '#plot polyline').get_attribute('points')
        assert len(points.split()) == 2, f'the val_acc plot has points {points!r}'
        driver.save_screenshot(os.path.join(out, 'model.png'))

        # Another caller promotes; the open page follows without a reload.
        post(base, '/api/v1/models/team-a-resnet/promote', 'team-a-token',
             {'version': 2, 'alias': 'production', 'reason': 'browser test'})
        wait.until(EC.text_to_be_present_in_element(
            (By.CSS_SELECTOR, '#versions tr[data-version="2"]'), 'production'))
        wait.until(EC.text_to_be_present_in_element((By.ID, 'timeline'), 'browser test'))
        timeline = driver.find_element(By.ID, 'timeline').text
        assert 'team-a' in timeline, f'the timeline does not name who moved it: {timeline!r}'
        driver.save_screenshot(os.path.join(out, 'model-after-promotion.png'))

        # A version's page: how to load it, its tensors; then the change from version 1 to 2.
        driver.find_element(By.CSS_SELECTOR, '#versions tr[data-version="1"] td a').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'tensors'), 'fc.weight'))
        load_lines = driver.find_element(By.ID, 'load-lines').text
        assert 'export team-a-resnet@1 model.safetensors' in load_lines, load_lines
        assert '--store=127.0.0.1:' in load_lines, load_lines
        graph = driver.find_element(By.ID, 'lineage-graph').text
        assert 'team-a-resnet-ft@1' in graph and 'fine tuned' in graph, f'the graph says {graph!r}'
        driver.save_screenshot(os.path.join(out, 'version.png'))
        driver.back()
        # Compare through the form (its default: the version before the latest with the latest).
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, '#compare-form button')))
        driver.find_element(By.CSS_SELECTOR, '#compare-form button').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'changed'), 'fc.weight'))
        heading = driver.find_element(By.ID, 'compare-name').text
        assert heading == 'team-a-resnet@1 \u2192 team-a-resnet@2', heading
        driver.save_screenshot(os.path.join(out, 'compare.png'))

        errors = [entry for entry in driver.get_log('browser') if entry['level'] == 'SEVERE']
        assert not errors, f'errors in the browser console: {errors}'

        # A token the store does not know: the sign-in form again, with the store's words.
        driver.find_element(By.ID, 'signout').click()
        wait.until(EC.presence_of_element_located((By.ID, 'token'))).send_keys('wrong-token')
        driver.find_element(By.CSS_SELECTOR, '#signin button[type=submit]').click()
        wait.until(EC.presence_of_element_located((By.ID, 'signin-error')))
        driver.save_screenshot(os.path.join(out, 'refused.png'))
        print('browser: every page checked')
    finally:
        driver.quit()


if __name__ == '__main__':
    main()
